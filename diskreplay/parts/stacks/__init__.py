"""Frame stacks: the ring of stacked observations kept once per frame, and the batch
decode that rebuilds stacks from it."""
