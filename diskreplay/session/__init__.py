"""An open store: the session a writer or reader holds, the writer and its flushes, the fast
add paths, the reader, the undo copy and conversion between backends."""
