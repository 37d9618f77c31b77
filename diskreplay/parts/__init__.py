"""Side data a store may carry beside its rows (the jump ring, frame stacks, priorities):
each part owns its files and says what it needs at create, open, add and recovery."""
