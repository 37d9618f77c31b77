"""The backend contract (tests/support/backend_contract.py) for each backend. Each class
names its backend and reads and writes raw rows with the library that owns its file
format, never through diskreplay: a new backend is one more class like these."""
import os

import h5py
import numpy as np

from backend_contract import BackendContract


class TestMemmap(BackendContract):
    name = "memmap"

    def read_row(self, directory, field, slot):
        return np.array(np.load(os.path.join(directory, f"{field}.npy"), mmap_mode="r")[slot])

    def write_row(self, directory, field, slot, value):
        arr = np.load(os.path.join(directory, f"{field}.npy"), mmap_mode="r+")
        arr[slot] = value
        arr.flush()
        del arr


class TestHDF5(BackendContract):
    name = "hdf5"

    def read_row(self, directory, field, slot):
        with h5py.File(os.path.join(directory, "data.h5"), "r") as f:
            return np.array(f[field][slot])

    def write_row(self, directory, field, slot, value):
        with h5py.File(os.path.join(directory, "data.h5"), "r+") as f:
            f[field][slot] = value
