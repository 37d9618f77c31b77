"""The replay semantics, pure and without files: the ring's arithmetic, the schema, episodes,
row order, n-step returns and the read-ahead. Nothing here opens a file."""
