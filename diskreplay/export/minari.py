"""A store as a Minari dataset, written through the ``minari`` package (the ``[minari]``
extra) and its public API: ``create_dataset_from_buffers`` then
``MinariDataset.update_dataset_from_buffer``, a few episodes at a time.

Each episode of ``DiskReplay.episodes()`` (per env, oldest first; the order ``episodes()``
yields them in) becomes one Minari episode: ``observations`` its T+1 states (the last is
the next state the store returns for its final transition), ``actions``, ``rewards``,
``terminations`` (``dones``) and ``truncations`` (the ``truncateds`` field where the store
has one; an episode that ends without terminating otherwise, at a next-state jump or at
the end of the data, gets ``True`` on its last step), and every extra field as
``infos[name]`` (T rows: ``infos[name][t]`` belongs to step t). Incomplete episodes (the
ring overwrote their start, or they have not ended) are skipped and counted unless
``include_incomplete``. Spaces are ``Box`` es of the fields' shapes and dtypes (unbounded
for floats, the dtype's range for integers); nothing is JPEG-encoded.

The dataset goes to ``<root>/<dataset_id>`` (``root`` is a Minari datasets root:
``MINARI_DATASETS_PATH=root`` makes ``minari.load_dataset(dataset_id)`` find it). It is
built in a hidden directory beside it and renamed into place when complete. Memory holds
a few episodes: bounded by the longest episode, whatever the store's size.
"""
from __future__ import annotations

import contextlib
import os
import re
import warnings
from typing import Callable

import numpy as np

from ..episodereader import EpisodeReader
from ..core.episodes import TRUNCATION_FIELD
from ..disk.fsutil import create_temp, discard, replace_directory, sweep_temps, temp_name
from ..errors import InvalidArgumentError, MissingDependencyError, OutputExistsError

DATASET_ID = re.compile(r"[-_A-Za-z0-9]+-v[0-9]+")
BATCH_BYTES = 16 << 20
BATCH_EPISODES = 256
_NOT_INFOS = ("env", "states", "actions", "rewards", "dones", "slots", "complete")


def default_dataset_id(path) -> str:
    """``<store name>-v0``: the store directory's name without its suffix, other characters than
    letters, digits, ``-`` and ``_`` replaced by ``-``."""
    name = os.path.splitext(os.path.basename(os.path.abspath(os.fspath(path))))[0]
    return (re.sub(r"[^-_A-Za-z0-9]", "-", name) or "diskreplay") + "-v0"


def load_minari():
    """The ``minari`` module, or MissingDependencyError saying how to install it."""
    try:
        import minari
    except ImportError as exc:
        raise MissingDependencyError(f"the minari format needs the minari package ({exc}); "
                                     "install it with pip install 'diskreplay[minari]'") from None
    return minari


def export_minari(buf, root, *, start: int | None = None, stop: int | None = None,
                  progress: Callable[[int, int], None] | None = None, overwrite: bool = True,
                  dataset_id: str | None = None, include_incomplete: bool = False) -> dict:
    """Write the episodes of the chronological positions ``[start, stop)`` of ``buf`` as the
    Minari dataset ``dataset_id`` under the datasets root ``root``; see the module's text.
    Returns ``{"rows", "episodes", "skipped_incomplete", "skipped_overwritten", "format",
    "dataset_id", "path"}``."""
    dataset_id = default_dataset_id(buf.path) if dataset_id is None else dataset_id
    if not isinstance(dataset_id, str) or not DATASET_ID.fullmatch(dataset_id):
        raise InvalidArgumentError(f"the dataset id must look like name-v0 (letters, digits, - and _, then -v and "
                                   f"a version number; no namespace), got {dataset_id!r}")
    root = os.path.abspath(os.fspath(root))
    if os.path.exists(root) and not os.path.isdir(root):
        raise InvalidArgumentError(f"cannot write a Minari dataset to {root}: it is a file; the minari format "
                                   "takes a directory (a Minari datasets root)")
    if not os.path.isdir(os.path.dirname(root)):
        raise InvalidArgumentError(f"cannot write {root}: the directory {os.path.dirname(root)} does not exist")
    final = os.path.join(root, dataset_id)
    if not overwrite and os.path.lexists(final):
        raise OutputExistsError(f"the Minari dataset {final} exists; pass overwrite=True to replace it")
    minari = load_minari()
    obs_space, action_space = _space(buf, "states"), _space(buf, "actions")
    os.makedirs(root, exist_ok=True)
    sweep_temps(final)
    staging = None
    try:  # the staging directory: a new one (never a planted path), named inside the try (fsutil)
        staging = temp_name(final)
        create_temp(staging, directory=True)
        with _datasets_path(staging), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # metadata minari recommends (author, code) we cannot know
            dataset = minari.create_dataset_from_buffers(
                dataset_id, [], observation_space=obs_space, action_space=action_space,
                description=f"exported by diskreplay from {os.path.basename(os.path.abspath(buf.path))}",
                algorithm_name="unknown (diskreplay export)", data_format="hdf5", jpeg_encoding=False)
            reader = EpisodeReader(buf, start, stop, progress=progress)
            counts = _write_episodes(minari, dataset, reader, include_incomplete)
        replace_directory(os.path.join(staging, dataset_id), final)
    finally:
        discard(staging)
    return {**counts, "skipped_overwritten": reader.skipped, "format": "minari", "dataset_id": dataset_id,
            "path": final}


def _write_episodes(minari, dataset, reader: EpisodeReader, include_incomplete: bool) -> dict:
    from minari.data_collector import EpisodeBuffer

    pending, pending_bytes = [], 0
    rows = episodes = skipped = 0
    for ep in reader:
        data = ep.data
        if not data["complete"] and not include_incomplete:
            skipped += 1
            continue
        pending.append(_episode_buffer(EpisodeBuffer, data, ended=ep.ended))
        pending_bytes += sum(v.nbytes for v in data.values() if isinstance(v, np.ndarray))
        rows += ep.length
        episodes += 1
        if pending_bytes >= BATCH_BYTES or len(pending) >= BATCH_EPISODES:
            dataset.update_dataset_from_buffer(pending)
            pending, pending_bytes = [], 0
    if pending:
        dataset.update_dataset_from_buffer(pending)
    return {"rows": rows, "episodes": episodes, "skipped_incomplete": skipped}


def _episode_buffer(EpisodeBuffer, data: dict, *, ended: bool):
    steps = len(data["rewards"])
    terminations = data["dones"].reshape(steps, -1).any(axis=1)
    if TRUNCATION_FIELD in data:
        truncations = data[TRUNCATION_FIELD].reshape(steps, -1).any(axis=1)
    else:
        truncations = np.zeros(steps, bool)
    if not (terminations[-1] or truncations[-1]):
        truncations[-1] = True  # ended by a next-state jump, or cut by the end of the data
    rewards = data["rewards"]
    if rewards.ndim > 1 and rewards[0].size == 1:
        rewards = rewards.reshape(steps)
    infos = {name: value for name, value in data.items() if name not in _NOT_INFOS}
    return EpisodeBuffer(observations=data["states"], actions=data["actions"], rewards=rewards,
                         terminations=terminations, truncations=truncations, infos=infos or None)


def _space(buf, field: str):
    from gymnasium import spaces

    shape, dtype = buf.fields[field]
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return spaces.Box(low=-np.inf, high=np.inf, shape=tuple(shape), dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return spaces.Box(low=info.min, high=info.max, shape=tuple(shape), dtype=dtype)
    raise InvalidArgumentError(f"the minari format takes float or integer {field}; this store's {field} "
                               f"are {dtype}")


@contextlib.contextmanager
def _datasets_path(path: str):
    """Minari's writing API places datasets under ``MINARI_DATASETS_PATH``: point it at ``path``
    for the block (this process's environment; the previous value comes back after)."""
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = path
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous



__all__ = ["default_dataset_id", "export_minari", "load_minari"]
