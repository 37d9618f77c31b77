"""The part contract (``diskreplay.parts.base.Part``), one class every part subclasses, run
for each part on every backend, the way ``backend_contract.py`` runs for backends.

A part's subclass names the store kind that has it (``tests/support/stores.py``); the
contract then checks what every part promises: its declared files are the files on disk,
the free-space count covers the bytes those files can reach, the store reopens with the same
data, ``verify`` catches a damaged byte of each of its files, and ``convert`` keeps its data
both ways. Its durability half (kill -9, power cuts, an exception at every line of the part's
code) is ``tests/durability/test_parts_durability.py``. A new part (compressed rows,
sequences, marks) gets all of it by subclassing both."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from stores import KINDS, MAX_SIZE, NUM_ENVS, fill, make_store

from diskreplay import DiskReplay, InvalidArgumentError
from diskreplay.backends import BACKENDS, get_backend
from diskreplay.parts import PARTS, Geometry, parts_of
from diskreplay.parts.jumps import Jumps
from diskreplay.parts.priorities.files import PrioritiesPart
from diskreplay.parts.stacks.ring import Stacks
from diskreplay.session.files import data_file_names
from diskreplay.verify import verify_store

FIXED = {"store.json", "meta.bin", "lock", "ns_buffer.npy", "rowsums.npy", "checkpoint.bin"}


def _geometry(path) -> Geometry:
    with DiskReplay.open(path, mode="r") as buf:
        return Geometry.of(buf._session.desc, buf.prioritized)


class PartContract:
    part: type = None
    kind: str = ""  # its store kind in stores.KINDS

    def part_data(self, buf) -> dict:
        """What the part serves readers (compared across reopen and convert): every row,
        next states and the part's own keys included."""
        return {"get": buf.get(np.arange(buf.size))}

    # ------------------------------------------------------------------ helpers
    def _store(self, tmp_path, backend, laps: float = 2.5):
        path = tmp_path / f"{self.part.name}-{backend}.replay"
        with make_store(self.kind, backend, path=path) as buf:
            fill(buf, int(laps * MAX_SIZE / NUM_ENVS))
        return path

    @staticmethod
    def _same(a: dict, b: dict) -> None:
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], dict):
                PartContract._same(a[key], b[key])
            else:
                np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)

    @staticmethod
    def _own_files(g: Geometry, part) -> list[str]:
        """A part's files beside the datasets it keeps in the backend."""
        return sorted(set(part.files(g)) - set(g.backend.data_files(part.datasets(g))))

    # ------------------------------------------------------------------ the contract
    def test_the_part_is_wanted_and_its_files_are_the_files_on_disk(self, tmp_path, backend):
        path = self._store(tmp_path, backend)
        g = _geometry(path)
        assert self.part in parts_of(g)
        on_disk = set(os.listdir(path))
        files = set(self.part.files(g))
        assert files <= on_disk, f"{self.part.name} declares {sorted(files - on_disk)}, not on disk"
        own = files - set(g.backend.data_files(self.part.datasets(g)))  # beside its datasets in the backend
        assert own <= set(self.part.names), "the directory knows a part's files by its names"
        declared = set(data_file_names(g.backend, g.specs, g.prioritized, g.frame_stack)) | FIXED
        assert on_disk <= declared, f"files nobody declares: {sorted(on_disk - declared)}"

    def test_the_free_space_count_covers_what_its_files_reach(self, tmp_path, backend):
        """Every byte its files can take, apparent and allocated, after laps of the ring."""
        path = self._store(tmp_path, backend, laps=4)
        g = _geometry(path)
        own = self._own_files(g, self.part)
        apparent = sum(os.stat(path / name).st_size for name in own)
        allocated = sum(os.stat(path / name).st_blocks * 512 for name in own)
        needed = self.part.bytes_needed(g)
        assert apparent <= needed, (apparent, needed)
        assert allocated <= needed + 4096 * len(own), (allocated, needed)

    def test_reopen_serves_the_same_data(self, tmp_path, backend):
        path = self._store(tmp_path, backend)
        with DiskReplay.open(path, mode="r") as buf:
            before = self.part_data(buf)
        with DiskReplay.open(path) as buf:
            self._same(self.part_data(buf), before)
        with DiskReplay.open(path, mode="r") as buf:
            self._same(self.part_data(buf), before)

    def test_verify_catches_a_damaged_byte_of_each_of_its_files(self, tmp_path, backend):
        path = self._store(tmp_path, backend)
        assert verify_store(path).ok
        g = _geometry(path)
        own = self._own_files(g, self.part)
        assert own
        for name in own:
            copy = tmp_path / f"damaged-{name}"
            shutil.copytree(path, copy)
            with open(copy / name, "r+b") as f:  # the magic of a .npy header, or of priorities.bin
                first = f.read(1)
                f.seek(0)
                f.write(bytes([first[0] ^ 0xFF]))
            report = verify_store(copy)
            assert not report.ok and any(name in p for p in report.problems), (name, report.problems)

    @pytest.mark.parametrize("other", BACKENDS)
    def test_convert_keeps_its_data_both_ways(self, tmp_path, backend, other):
        path = self._store(tmp_path, backend)
        there, back = tmp_path / "there.replay", tmp_path / "back.replay"
        DiskReplay.convert(path, there, backend=other)
        DiskReplay.convert(there, back, backend=backend)
        with DiskReplay.open(path, mode="r") as a, DiskReplay.open(back, mode="r") as b:
            self._same(self.part_data(a), self.part_data(b))
        assert verify_store(there).ok and verify_store(back).ok


class TestJumps(PartContract):
    part, kind = Jumps, "jumps"


class TestStacks(PartContract):
    part, kind = Stacks, "stacks"


class TestPriorities(PartContract):
    part, kind = PrioritiesPart, "priorities"

    def part_data(self, buf):
        return {"get": buf.get(np.arange(buf.size)), "tree": buf.get(np.arange(buf.size))["priorities"]}


def test_every_part_has_a_contract_class():
    covered = {cls.part for cls in PartContract.__subclasses__()}
    assert covered == set(PARTS), f"parts without contract tests: {set(PARTS) - covered}"


def test_the_geometry_of_create_and_of_an_open_store_agree(tmp_path, backend):
    """create counts from its arguments, verify and open from store.json: the same geometry."""
    path = tmp_path / "g.replay"
    with make_store("stacks", backend, path=path) as buf:
        fill(buf, 1)
    g = _geometry(path)
    assert g.backend.data_files(g.specs) == get_backend(backend).data_files(g.specs)
    assert g.frame_stack == 4 and g.states.shape[0] == 4 and g.specs["states"].shape == (24,)


@pytest.mark.parametrize("name", sorted({f[:-4] for part in PARTS for f in part.names if f.endswith(".npy")}))
def test_a_field_named_like_a_part_file_is_refused_before_anything_is_touched(tmp_path, backend, name):
    """A memmap field ``jumps`` would be ``jumps.npy``, the jump ring's file: refused on every
    backend (so the store converts), and ``overwrite=True`` leaves the store there untouched."""
    path = tmp_path / "kept.replay"
    with make_store("jumps", backend, path=path) as buf:
        fill(buf, 5)
        before = buf.get(np.arange(buf.size))
    fields = {**KINDS["jumps"]["fields"], name: ((), "float32")}
    with pytest.raises(InvalidArgumentError, match=f"field name '{name}' is reserved"):
        DiskReplay.create(path, 10, backend=backend, fields=fields, overwrite=True)
    with DiskReplay.open(path, mode="r") as buf:
        PartContract._same(buf.get(np.arange(buf.size)), before)
    with pytest.raises(InvalidArgumentError, match="reserved"):  # fields inferred at the first add
        with DiskReplay.create(tmp_path / "lazy.replay", 10, backend=backend) as buf:
            buf.add(np.zeros(3, np.float32), 0, 0.0, np.zeros(3, np.float32), False, **{name: np.float32(1)})
    with DiskReplay.open(tmp_path / "lazy.replay") as buf:  # still a store, still empty, still usable
        assert buf.seen_size == 0
        buf.add(np.zeros(3, np.float32), 0, 0.0, np.zeros(3, np.float32), False)
        assert buf.seen_size == 1
