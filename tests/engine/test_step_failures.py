"""What a failed step reports (ds_hetero/failures.py): this rank's own error as itself, or which peer stopped.

Distributed, 2 CPU ranks, colocated vision dp2 + language dp2 (one engine shared by both stages,
stages/shared_engine.py: the raise comes while its gradient reduction is held off, and the raising
rank must not enter the reduction its peer will never join):
- rank 1's language forward raises ValueError in step 1: rank 1 reports that ValueError, noted with
  its rank, stages and step, never as a stopped peer; rank 0 (whose collective then fails) says a
  peer stopped answering and names rank 1 with its error.
- every rank raises in its own work (as a frozen encoder under a pipeline did): each reports its
  own error, none says a peer stopped.
- after rank 1 raised mid-step, every rank that caught the error and goes on (train_batch again, eval_batch,
  save_checkpoint) gets one clear refusal naming the failed step, never a collective paired across steps
  or a hang (without the guard the retry ran collectives out of order: issue 49).
A rank that dies is named by the survivors in tests/engine/test_disaggregated.py (killed mid-step) and
tests/step/test_step_agreement.py (killed at a step boundary).
Pure: a collective's failure is told from a local error by where it was raised.
"""

import pytest

from ds_hetero.testing.launch import RankFailure, run_distributed


def _engine_after_one_step(timeout_s):
    """Colocated vision dp2 + language dp2 (one shared engine) on the tiny LLaVA, one step taken: (engine, samples)."""
    import ds_hetero
    from ds_hetero.toy import tiny_llava
    from ds_hetero.testing.batches import llava_samples

    model = tiny_llava("clip", seed=1)
    config = {"train_batch_size": 4, "zero_optimization": {"stage": 1}, "steps_per_print": 10**6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_allow_untested_optimizer": True,
              "hetero_parallel": {"micro_batches": 1, "timeout_s": timeout_s,
                                  "stages": {"vision": {"dp": 2}, "language": {"dp": 2}}}}
    engine = ds_hetero.initialize(model, config)
    samples = llava_samples(model, 4, seed=3)
    engine.train_batch(samples)
    return engine, samples


def _raise_in_step_1(rank, world_size, raising):
    engine, samples = _engine_after_one_step(30)
    if rank in raising:
        stage = engine.stages["language"].module  # the stage's own module (a shared engine holds both)

        def forward(*args, **kwargs):
            raise ValueError(f"boom on rank {rank}")

        stage.forward = forward
    engine.train_batch(samples)


def _retry_after_a_failed_step(rank, world_size):
    """Rank 1 raises in step 1's language forward; every rank catches the error and goes on as a retry loop or
    a Trainer callback would: train_batch again (rank 1's forward restored), eval_batch, save_checkpoint."""
    import tempfile

    engine, samples = _engine_after_one_step(10)
    stage = engine.stages["language"].module
    if rank == 1:
        def forward(*args, **kwargs):
            raise ValueError("boom on rank 1")

        stage.forward = forward
    out = {}
    try:
        engine.train_batch(samples)
    except Exception as exc:  # noqa: BLE001
        out["first"] = f"{type(exc).__name__}: {exc}"
    if rank == 1:
        del stage.forward  # the retry loop "fixed" the cause
    for name, call in (("retry", lambda: engine.train_batch(samples)), ("eval", lambda: engine.eval_batch(samples)),
                       ("save", lambda: engine.save_checkpoint(tempfile.mkdtemp()))):
        try:
            call()
            out[name] = "ran"
        except Exception as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {exc}"
    out["steps"] = engine.global_steps
    return out


@pytest.mark.distributed
def test_after_a_failed_step_every_rank_refuses_to_go_on():
    results = run_distributed(_retry_after_a_failed_step, world_size=2, timeout=240, grace_s=30)
    for rank, r in enumerate(results):
        assert "boom on rank 1" in r["first"], r  # rank 1 its own error, rank 0 the peer's
        assert r["steps"] == 1, r  # neither rank counted the failed step
        for name, what in (("retry", "train_batch"), ("eval", "eval_batch"), ("save", "save_checkpoint")):
            assert r[name].startswith(f"RuntimeError: ds_hetero: {what} refused on rank {rank}: step 1 failed"), r
            assert "restore from a checkpoint" in r[name] and "boom on rank 1" in r[name], r


def _sections(results):
    assert all(isinstance(r, RankFailure) for r in results), results
    return [r.message for r in results]


@pytest.mark.distributed
def test_a_rank_raising_reports_its_own_error_and_its_peer_names_it():
    own, peer = None, None
    results = run_distributed(_raise_in_step_1, world_size=2, timeout=240, grace_s=30, check=False, raising=(1,))
    peer, own = _sections(results)
    assert "ValueError: boom on rank 1" in own, own
    assert "ds_hetero: raised on rank 1 (vision, language) by its own work in step 1" in own, own
    assert "stopped answering" not in own, own
    assert "ds_hetero: rank 0 (vision, language) failed in step 1: a peer rank stopped answering: " \
           "rank 1 raised ValueError in step 1: boom on rank 1" in peer, peer


@pytest.mark.distributed
def test_every_rank_raising_reports_its_own_error():
    results = run_distributed(_raise_in_step_1, world_size=2, timeout=240, grace_s=30, check=False,
                              raising=(0, 1))
    for rank, text in enumerate(_sections(results)):
        assert f"ValueError: boom on rank {rank}" in text, text
        assert f"raised on rank {rank} (vision, language) by its own work in step 1" in text, text
        assert "stopped answering" not in text, text


def test_collective_failures_are_told_from_local_errors():
    import torch
    import torch.distributed as dist

    from ds_hetero.failures import is_collective_failure

    try:  # raised inside torch.distributed (no process group): a collective's failure
        dist.all_reduce(torch.ones(1))
    except (RuntimeError, ValueError) as exc:
        assert is_collective_failure(exc)
    try:  # autograd refusing a backward: this rank's own work
        torch.ones(1).sum().backward()
    except RuntimeError as exc:
        assert not is_collective_failure(exc)
    assert is_collective_failure(dist.DistBackendError("NCCL error"))  # torch's own type, wherever raised
    assert not is_collective_failure(ValueError("a model's own error"))
