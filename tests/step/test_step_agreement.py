"""Every rank of every stage reaches one verdict on a global batch, and every failure names the step.

One 2-rank disaggregated launch (vision on rank 0, language on rank 1: the layout where only
the language rank can see that a batch has no label tokens):

1. a batch without label tokens, a batch of the wrong size, a batch with a bad sample and
   different batches on the two ranks are refused with a ValueError on both ranks, before any
   collective of the step, and change nothing: the weights are bit-identical and the next good
   batch trains as if they had never been given (same loss as a fresh engine's second step);
   the boundary's own consensus all-reduce runs in the first step only;
2. rank 1 is killed at a step boundary (before the step's first collective) while rank 0 reads
   from the loader: rank 0 raises the engine's error naming its rank and the step within a few
   seconds of the kill (gloo notices the closed connection), not a raw gloo error and not after
   the timeout.

Negative control: before the batch agreement, rank 0 (vision) did not refuse the label-less
batch (it went on into the schedule) and its loader-side sample consensus ran outside the
engine's error wrapper (a raw "Connection closed by peer").
"""

import time

import pytest

from ds_hetero.testing.launch import RankFailure, run_distributed

pytestmark = pytest.mark.distributed

TIMEOUT_S = 30  # hetero_parallel.timeout_s: a survivor must raise long before it
RAISE_WITHIN_S = 10  # after the kill; gloo reports a closed connection in well under a second


def _config():
    return {
        "train_batch_size": 4, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": "disaggregated", "micro_batches": 2, "timeout_s": TIMEOUT_S,
                            "stages": {"vision": {"dp": 1}, "language": {"dp": 1}}},
    }


def _weights(engine):
    return [p.detach().clone() for e in engine.engines.values() for p in e.module.parameters()]


def _suite(rank, world_size, tmp):
    import os
    import signal

    import torch

    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava
    from ds_hetero.testing.batches import llava_samples

    def refused(engine, samples, words):
        before = _weights(engine)
        try:
            engine.train_batch(samples)
        except ValueError as exc:
            assert words in str(exc), str(exc)
            assert all(torch.equal(a, b) for a, b in zip(before, _weights(engine)))
            return str(exc)
        raise AssertionError(f"rank {rank}: the batch was not refused ({words!r})")

    model = tiny_llava("clip", seed=3)
    data = ShapesCaptionDataset.for_llava(model.config, size=16, seed=0)
    good = [llava_samples(model, 4, seed=s) for s in range(2)]

    fresh = ds_hetero.initialize(tiny_llava("clip", seed=3), _config())
    want = [fresh.train_batch(b).loss for b in good]
    fresh.groups.destroy()

    engine = ds_hetero.initialize(model, _config(), training_data=data)
    consensus = []
    boundary = engine.boundaries["vision"]
    agree = boundary._agree
    boundary._agree = lambda *a, **k: consensus.append(engine.global_steps) or agree(*a, **k)
    first = engine.train_batch(good[0]).loss
    no_labels = [dict(s, labels=torch.full_like(s["labels"], -100)) for s in good[1]]
    text_only = {"input_ids": good[1][0]["input_ids"][-8:], "labels": good[1][0]["labels"][-8:]}
    out = {"errors": [
        refused(engine, no_labels, "no label tokens"),
        refused(engine, good[1][:3], "got 3 samples"),
        refused(engine, [dict(s, labels=s["labels"][1:]) if i == 2 else s for i, s in enumerate(good[1])],
                "differ in shape"),
        # rank 1 alone is given a text-only first sample: each rank's batch is valid, but they differ
        refused(engine, ([text_only] + good[1][1:]) if rank == 1 else good[1], "different global batches"),
    ]}
    second = engine.train_batch(good[1]).loss
    out["losses"] = [first, second]
    out["want"] = want
    out["consensus_steps"] = sorted(set(consensus))

    # 2. rank 1 dies at a step boundary; rank 0 reads its share from the loader
    kill_file = os.path.join(tmp, "killed_at")
    dist_barrier(engine)
    if rank == 1:
        with open(kill_file, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # the kill lands first: the failure is in the step's first collective
    try:
        engine.train_batch()
    except RuntimeError as exc:
        raised_at = time.time()
        with open(kill_file) as f:
            killed_at = float(f.read())
        return dict(out, error=str(exc), after_s=raised_at - killed_at)
    raise AssertionError("rank 0 went on after its peer died")


def dist_barrier(engine):
    import torch.distributed as dist

    dist.barrier(group=engine.groups.boundary)


def test_bad_batches_are_refused_on_every_rank_and_a_dead_peer_is_named(tmp_path):
    survivor, dead = run_distributed(_suite, world_size=2, timeout=300, grace_s=2 * TIMEOUT_S, check=False,
                                     tmp=str(tmp_path))
    assert isinstance(dead, RankFailure) and "rank 1 died with exit code -9" in dead.message, dead
    assert not isinstance(survivor, RankFailure), survivor.message
    out = survivor
    # every refusal happened on rank 0 too (the vision rank, which cannot see labels)
    assert len(out["errors"]) == 4, out
    assert out["consensus_steps"] == [0], out  # the boundary's per-exchange check: first step only
    # the refusals changed nothing: the good batches train exactly as on a fresh engine
    assert out["losses"] == pytest.approx(out["want"], rel=1e-6), out
    # the dead peer surfaces through the engine's error, naming rank and step, within seconds
    assert "ds_hetero: rank 0 (vision) failed in step 2" in out["error"], out["error"]
    assert "rank 1 left no report (it died" in out["error"], out["error"]  # the dead peer, named
    assert out["after_s"] < RAISE_WITHIN_S, out


@pytest.mark.parametrize("shape", [(1,), (7,), (1, 9), (3, 5)])
def test_label_total_counts_as_the_per_sample_loop(shape):
    """The agreement's label count (one concatenation) is the per-sample count summed, exactly;
    control: counting the labels unshifted (the first position included) differs."""
    import torch

    from ds_hetero.loss import IGNORE_INDEX, label_token_count, label_token_total

    g = torch.Generator().manual_seed(0)
    labels = []
    for i in range(6):
        x = torch.randint(0, 50, (*shape[:-1], shape[-1] + i), generator=g)
        x[torch.rand(x.shape, generator=g) < 0.4] = IGNORE_INDEX
        x[..., 0] = 7  # a label on the first position: no earlier token predicts it
        labels.append(x)
    assert label_token_total(labels) == sum(label_token_count(x) for x in labels)
    assert label_token_total([]) == 0
    unshifted = sum(int((x != IGNORE_INDEX).sum()) for x in labels)
    assert unshifted != label_token_total(labels)
