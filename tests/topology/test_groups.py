"""Process groups of every stage, built on real gloo processes, checked by collectives."""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed


def _check_groups(rank, world_size, config):
    import torch
    import torch.distributed as dist

    from ds_hetero.config import load_config
    from ds_hetero.topology.groups import build_groups

    cfg = load_config(config, world_size)
    groups = build_groups(cfg.stages, rank)
    seen = {}
    for name, layout in cfg.stages.items():
        sg = groups[name]
        if not layout.contains(rank):
            assert sg.tp is None and sg.dp is None and not sg.is_member
            continue
        for kind in ("tp", "cp", "dp", "dp_cp", "model"):
            group = getattr(sg, kind)
            expected = layout.group_containing(kind, rank)
            # The members of the group, as the collective sees them, are the layout's.
            t = torch.zeros(world_size)
            t[rank] = 1.0
            dist.all_reduce(t, group=group)
            members = tuple(int(i) for i in t.nonzero().flatten())
            assert members == tuple(sorted(expected)), (name, kind, members, expected)
            assert sg.ranks_of[kind] == expected
            seen.setdefault(tuple(sorted(expected)), set()).add(id(group))
    # identical rank sets share one group object
    assert all(len(ids) == 1 for ids in seen.values()), seen
    t = torch.ones(1)
    dist.all_reduce(t, group=groups.boundary)
    assert t.item() == len(groups.boundary_ranks)
    groups.destroy()
    return sorted(len(k) for k in seen)


def test_colocated_and_disaggregated_groups_on_four_ranks():
    colocated = {"train_batch_size": 8, "hetero_parallel": {"stages": {
        "vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}}}
    run_distributed(_check_groups, world_size=4, timeout=90, config=colocated)
    disaggregated = {"train_batch_size": 3, "hetero_parallel": {"placement": "disaggregated", "stages": {
        "vision": {"dp": 1, "ranks": [3]}, "language": {"tp": 1, "cp": 1, "dp": 3}}}}
    run_distributed(_check_groups, world_size=4, timeout=90, config=disaggregated)


def test_cp_groups_on_four_ranks():
    config = {"train_batch_size": 4, "hetero_parallel": {"stages": {
        "vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "cp": 2, "dp": 1}}}}
    run_distributed(_check_groups, world_size=4, timeout=90, config=config)
