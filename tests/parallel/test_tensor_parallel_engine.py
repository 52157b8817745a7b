"""A DeepSpeed engine over a tp-sharded language stage matches a single-process reference.

Language stage tp 2 x dp 2 on 4 ranks: a Llama causal LM sharded with shard_language_model
(vocab-parallel head and loss), one engine per rank with the stage's StageMPU, torch AdamW
passed in, `gradient_clipping` set well below the gradient norm. After three steps on the same
global batches, every loss and every (gathered) weight equals the unsharded model trained in
one process with the same clipping, for ZeRO 0, 1 and 2, and with sequence parallelism.

Controls that show the comparison can fail: the reference without clipping ends elsewhere (so
the norm matters), and an engine whose sharded parameters lose their `tensor_model_parallel`
tag (DeepSpeed then counts them on tp rank 0 only, so the norm and the clipping are wrong)
does not match. AdamW's eps is set near the clipped gradients' size: with eps ~ 0 Adam is
almost invariant to a uniform gradient scale and would hide a wrong clip coefficient.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

STEPS = 3
LR, EPS = 1e-2, 1e-4
BATCH, SEQ = 4, 16


def _batches():
    import torch

    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (BATCH, SEQ), generator=gen) for _ in range(STEPS)]


def _optimizer(params):
    import torch

    return torch.optim.AdamW(params, lr=LR, eps=EPS, weight_decay=0.01)


def _reference(clip):
    """Single process, whole global batch; returns (losses, pre-clip norms, final params)."""
    import torch

    from tests.helpers.tp_checks import llama_lm

    model = llama_lm()
    opt = _optimizer(model.parameters())
    losses, norms = [], []
    for ids in _batches():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf")).item())
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, norms, dict(model.named_parameters())


def _engine_run(groups, clip, zero_stage, sequence_parallel=False, untag=False):
    import deepspeed
    import torch

    from ds_hetero.topology.mpu import StageMPU, stage_context
    from ds_hetero.tensor_parallel import gather_full, shard_language_model
    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import llama_lm

    stage = groups["language"]
    mpu = StageMPU(stage)
    model = shard_language_model(llama_lm(), stage.tp, sequence_parallel=sequence_parallel, plans=tp_plans())
    sharded = [p for p in model.parameters() if getattr(p, "tensor_model_parallel", False)]
    if untag:  # negative control: DeepSpeed can no longer tell shards from replicas
        for p in sharded:
            del p.tensor_model_parallel
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // 2,
              "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": clip, "steps_per_print": 10**6}
    with stage_context(mpu):
        engine, *_ = deepspeed.initialize(model=model, optimizer=_optimizer(model.parameters()), mpu=mpu,
                                          config=config)
    dp_rank, losses = mpu.get_data_parallel_rank(), []
    for ids in _batches():
        mine = ids[dp_rank * BATCH // 2:(dp_rank + 1) * BATCH // 2]  # this dp rank's half of the batch
        with stage_context(mpu):
            loss = engine(input_ids=mine, labels=mine).loss
            engine.backward(loss)
            engine.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean, group=stage.dp)  # equal token counts: mean of means
        losses.append(mean.item() / 2)
    for p in sharded:
        p.tensor_model_parallel = True  # (back) for gathering
    params = {n: gather_full(p, p, stage.tp) for n, p in engine.module.named_parameters()}
    return losses, params


def _errors(losses, params, ref_losses, ref_params):
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    weight_err = max(((params[n] - r.detach()).abs().max() / r.detach().abs().max()).item()
                     for n, r in ref_params.items())
    return dict(loss=loss_err, weights=weight_err)


def _engine_checks(rank, world_size):
    from ds_hetero.patches import skip_cpu_shm_comm_build
    from ds_hetero.topology.groups import build_groups
    from ds_hetero.layout import StageLayout

    skip_cpu_shm_comm_build()
    groups = build_groups({"language": StageLayout("language", 2, 1, 2, (0, 1, 2, 3))}, rank)
    _, norms, _ = _reference(None)
    clip = 0.25 * norms[0]
    ref_losses, ref_norms, ref_params = _reference(clip)
    _, _, unclipped = _reference(None)
    out = {"clip": clip, "ref_norms": ref_norms,
           "unclipped_vs_clipped": _errors([1.0], unclipped, [1.0], ref_params)["weights"]}
    for name, kwargs in [("zero0", dict(zero_stage=0)), ("zero1", dict(zero_stage=1)),
                         ("zero2", dict(zero_stage=2)), ("zero1+sp", dict(zero_stage=1, sequence_parallel=True)),
                         ("zero1 untagged", dict(zero_stage=1, untag=True))]:
        out[name] = _errors(*_engine_run(groups, clip, **kwargs), ref_losses, ref_params)
    return out


@pytest.fixture(scope="module")
def engine_results():
    return run_distributed(_engine_checks, world_size=4, timeout=300)


@pytest.mark.parametrize("run", ["zero0", "zero1", "zero2", "zero1+sp"])
def test_engine_over_tp_stage_matches_single_process(engine_results, run):
    for rank, res in enumerate(engine_results):
        print(f"rank {rank} {run}: {res[run]}")
        assert res[run]["loss"] <= 1e-5 and res[run]["weights"] <= 1e-5, (rank, res[run])


def test_controls_show_the_comparison_can_fail(engine_results):
    for res in engine_results:
        print({k: res[k] for k in ("clip", "ref_norms", "unclipped_vs_clipped", "zero1 untagged")})
        assert all(n > res["clip"] for n in res["ref_norms"]), "clipping must be active at every step"
        assert res["unclipped_vs_clipped"] > 1e-3, res  # clipping changes the result far beyond tolerance
        assert res["zero1 untagged"]["weights"] > 1e-3, res["zero1 untagged"]
