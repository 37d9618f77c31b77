"""Bytes on disk, knowing nothing of replay: durable writes and renames, mapped files, ``.npy``
headers and the positional row reader."""
