"""A process group per (encoder, language) pair: two encoders' exchanges on 4 gloo ranks.

For a disaggregated 3-stage layout (vision on ranks 0-1, audio on 2, language on 3) and a mixed
one (vision on the language ranks 0-1, audio on 2-3), every rank builds every group in one
order; each encoder's communicator runs on its pair's group (a rank outside the pair never
calls it), the rows arrive where the destination order puts them, and each exchange is the
adjoint of its backward: sum over ranks <A x, y> == sum over ranks <x, A^T y>.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

H = 3
LAYOUTS = {
    "disaggregated": {"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 1, "ranks": [2]},
                      "language": {"dp": 1, "ranks": [3]}},
    "mixed": {"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
              "language": {"dp": 2, "ranks": [0, 1]}},
}
COUNTS = {"vision": [2, 0, 3, 1], "audio": [1, 4, 0, 2]}


def _case(rank, world_size, placement):
    import torch
    import torch.distributed as dist

    from ds_hetero.boundary import BoundaryCommunicator, BoundaryInputs
    from ds_hetero.config import load_config
    from ds_hetero.topology.groups import build_groups

    cfg = load_config({"train_batch_size": 4, "hetero_parallel": {"placement": placement,
                                                                  "stages": LAYOUTS[placement]}}, world_size)
    groups = build_groups(cfg.stages, rank)
    lang = cfg.language
    out = {"pairs": dict(groups.pairs), "checked": []}
    for name in ("vision", "audio"):  # config order on every rank
        src = cfg.stages[name]
        counts = COUNTS[name]
        inputs = BoundaryInputs(counts, [i % src.dp for i in range(4)], [i * lang.dp // 4 for i in range(4)])
        member = groups.pair_member(name)
        # the pair group's members, as a collective over it sees them
        if member:
            seen = torch.zeros(world_size)
            seen[rank] = 1
            dist.all_reduce(seen, group=groups.spanning(groups.pairs[name]))
            out[f"{name}_members"] = torch.nonzero(seen).flatten().tolist()
        if not member:
            continue
        comm = BoundaryCommunicator(src, lang, groups, placement, hidden_size=H, dtype=torch.float64)
        offsets = [sum(counts[:i]) for i in range(5)]
        gen = torch.Generator().manual_seed(11)
        X = torch.randn(offsets[-1], H, generator=gen, dtype=torch.float64)

        def rows(samples):
            return [g for i in samples for g in range(offsets[i], offsets[i + 1])]

        mine = rows([i for i in range(4) if src.contains(rank) and inputs.src_dp[i] == src.coord(rank).dp])
        need = rows([i for i in range(4) if lang.contains(rank) and inputs.dst_dp[i] == lang.coord(rank).dp])
        x = X[mine].clone().requires_grad_(True)
        y_out = comm.exchange(x, inputs)
        assert torch.equal(y_out.detach(), X[need]), (name, rank)
        y = torch.randn(y_out.shape, generator=torch.Generator().manual_seed(rank + 7), dtype=torch.float64)
        (y_out * y).sum().backward()
        sums = torch.stack([(y_out.detach() * y).sum(), (x * x.grad).sum()])
        dist.all_reduce(sums, group=comm.group)
        out["checked"].append((name, float(sums[0]), float(sums[1])))
    groups.destroy()
    return out


def _suite(rank, world_size):
    return {placement: _case(rank, world_size, placement) for placement in LAYOUTS}


def test_each_encoder_exchanges_over_its_own_pair_group():
    results = run_distributed(_suite, world_size=4, timeout=300)
    d = [r["disaggregated"] for r in results]
    assert d[0]["pairs"] == {"vision": (0, 1, 3), "audio": (2, 3)}
    assert [r.get("vision_members") for r in d] == [[0, 1, 3], [0, 1, 3], None, [0, 1, 3]]
    assert [r.get("audio_members") for r in d] == [None, None, [2, 3], [2, 3]]
    m = [r["mixed"] for r in results]
    assert m[0]["pairs"] == {"vision": (0, 1), "audio": (0, 1, 2, 3)}
    assert [[n for n, *_ in r["checked"]] for r in m] == [["vision", "audio"]] * 2 + [["audio"]] * 2
    for per_rank in results:
        for r in per_rank.values():
            assert r["checked"]
            for name, lhs, rhs in r["checked"]:
                assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12), (name, lhs, rhs)
