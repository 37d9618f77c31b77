"""Prioritized replay: the priorities file, the sum tree (numpy or native) and the
settings a prioritized store keeps."""
