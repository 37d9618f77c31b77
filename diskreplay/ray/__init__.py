"""Shards on Ray: ``ShardedReplay``, one local ``DiskReplay`` per Ray actor (the ``[ray]`` extra).

Importing this package imports ray; ``import diskreplay`` does not.
"""
from __future__ import annotations

from .sharded import ShardedReplay

__all__ = ["ShardedReplay"]
