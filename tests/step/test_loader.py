"""GlobalBatchLoader: one permutation per epoch, the same data order as drawing one per step."""

import torch

from ds_hetero.data.loader import GlobalBatchLoader


def _per_step_order(n, batch, seed, step):
    """The order the loader always had: a fresh seeded permutation of the epoch, drawn per step."""
    epoch, k = divmod(step, n // batch)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()[k * batch:(k + 1) * batch]


def test_one_permutation_per_epoch_and_the_same_order(monkeypatch):
    data = list(range(103))  # 12 full batches of 8 per epoch, 7 samples dropped
    loader = GlobalBatchLoader(data, 8, seed=3)
    want = [_per_step_order(103, 8, 3, step) for step in range(40)]
    calls = []
    real = torch.randperm
    monkeypatch.setattr(torch, "randperm", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = [loader.indices(step) for step in range(40)]
    assert got == want
    assert len(calls) == 4  # steps 0-39 span epochs 0, 1, 2, 3 (12 steps each)
    # every epoch visits distinct samples; the next epoch reshuffles
    assert len(set(sum(got[:12], []))) == 96 and got[:12] != got[12:24]


def test_unshuffled_order():
    loader = GlobalBatchLoader(list(range(10)), 4, shuffle=False)
    assert [loader.indices(s) for s in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
