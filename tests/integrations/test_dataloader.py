"""A reader in PyTorch DataLoader workers (issue 35 item 1): two forked workers read
correct rows through the reader their dataset holds while the writer in the main process
goes on adding (and wraps the ring)."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from diskreplay import DiskReplay


def row(t: int) -> np.ndarray:
    return np.full(3, t, np.float32)


class Slots(Dataset):
    def __init__(self, path, size):
        self.reader = DiskReplay.open(path, mode="r")
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, slot):
        got = self.reader.get([slot])
        return {key: value[0] for key, value in got.items()} | {"seen": self.reader.seen_size}


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_dataloader_workers_read_correct_rows_beside_a_live_writer(tmp_path, backend, prioritized):
    path = tmp_path / "s"
    writer = DiskReplay.create(path, 64, backend=backend, prioritized=prioritized)
    t = 0
    for t in range(64):
        writer.add(row(t), t, float(t), row(t + 1), False)
    loader = DataLoader(Slots(path, 64), batch_size=16, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    seen = []
    for epoch in range(3):
        for batch in loader:
            ts = batch["actions"].numpy()
            np.testing.assert_array_equal(batch["states"].numpy(), np.repeat(ts[:, None], 3, axis=1))
            np.testing.assert_array_equal(batch["next_states"].numpy(), np.repeat(ts[:, None] + 1, 3, axis=1))
            np.testing.assert_array_equal(batch["rewards"].numpy(), ts.astype(np.float32))
            if prioritized:
                assert torch.isfinite(batch["priorities"]).all()
            seen.append(int(batch["seen"].max()))
            for _ in range(5):  # the writer wraps the ring while the workers read
                t += 1
                writer.add(row(t), t, float(t), row(t + 1), False)
    assert max(seen) > 64  # the workers saw the writer's newer rows
    loader.dataset.reader.close()
    writer.close()
