"""The on-disk format of a store, one module per file it owns: the description, the
counters, the checkpoint, row checksums, the lock, the directory itself and recovery."""
