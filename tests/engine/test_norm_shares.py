"""Which stages take their gradient norm from per-rank shares (optimizer_step/norm_shares.py), pure.

The share path is exact only where each gradient element is counted by exactly one rank of the
stage: a ZeRO 1/2 optimizer without offload or experts, whose dp group times model-parallel
group is all of the stage's ranks per pipeline stage. Each refusal below keeps DeepSpeed's own
norm; the distributed check of the shares against that norm is in test_engine_parity.py.
"""

from types import SimpleNamespace

import pytest
import torch


class _Group:
    """A process group of `size` ranks, for the engine's dp / model-parallel groups without processes."""

    def __init__(self, size):
        self.size = size


@pytest.fixture(autouse=True)
def _group_sizes(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: group.size)


def _zero12(**attrs):
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    opt = object.__new__(DeepSpeedZeroOptimizer)  # the type check only: no engine is built
    defaults = dict(cpu_offload=False, has_moe_layers=False, bit16_groups=[[torch.nn.Parameter(torch.ones(2))]],
                    dp_process_group=_Group(1), model_parallel_group=None, groups_lacking_loss_scale=set(), custom_loss_scaler=False,
                    loss_scaler=SimpleNamespace(cur_scale=1.0))
    for k, v in {**defaults, **attrs}.items():
        object.__setattr__(opt, k, v)
    return opt


def _stage(opt, ranks=(0,), pp=1):
    return SimpleNamespace(name="s", engine=SimpleNamespace(optimizer=opt), layout=SimpleNamespace(ranks=ranks, pp=pp))


def test_a_one_rank_zero12_stage_shares_its_norm():
    from ds_hetero.optimizer_step.norm_shares import shares_norm, shares_this_step

    assert shares_norm(_stage(_zero12()))
    assert shares_this_step(_zero12())


@pytest.mark.parametrize("why, stage", [
    ("offload", lambda: _stage(_zero12(cpu_offload=True))),
    ("DeepSpeed MoE", lambda: _stage(_zero12(has_moe_layers=True))),
    ("torch optimizer (ZeRO 0)", lambda: _stage(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0))),
    # two ranks but the engine's groups span one: a replicated axis outside dp x model parallel
    ("replicated axis", lambda: _stage(_zero12(), ranks=(0, 1))),
])
def test_other_stages_keep_deepspeeds_norm(why, stage):
    from ds_hetero.optimizer_step.norm_shares import shares_norm

    assert not shares_norm(stage()), why


def test_expert_parameters_keep_deepspeeds_norm():
    from ds_hetero.optimizer_step.norm_shares import shares_norm

    expert = torch.nn.Parameter(torch.ones(2))
    expert.expert_parallel = True
    assert not shares_norm(_stage(_zero12(bit16_groups=[[expert]])))


def test_pipeline_stages_count_their_own_ranks():
    """pp 2 over 2 ranks: each pipeline stage's engine is one rank (dp 1, no model parallel)."""
    from ds_hetero.optimizer_step.norm_shares import shares_norm

    assert shares_norm(_stage(_zero12(), ranks=(0, 1), pp=2))


def test_a_muon_group_without_the_loss_scale_keeps_deepspeeds_norm_that_step():
    from ds_hetero.optimizer_step.norm_shares import shares_this_step

    opt = _zero12(groups_lacking_loss_scale={0}, loss_scaler=SimpleNamespace(cur_scale=1024.0))
    assert not shares_this_step(opt)
