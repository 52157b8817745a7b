"""A rank killed mid-step is named by every survivor under expert parallelism (issue 49), where a
survivor's groups often do not include the dead rank: it learns of the failure only when another
survivor exits, after the store's host may have gone (ds_hetero/liveness.py).

Distributed: Qwen3-VL-MoE on 4 CPU ranks, vision dp4 + language tp2 dp2 ep2, and with a pipelined
language stage on 2 ranks (vision dp2 + language pp2); rank 1 is SIGKILLed in its language forward
of step 1. Every survivor raises the engine's error naming rank 1, well before the timeout (the
disaggregated placement: tests/engine/test_disaggregated.py). Pure negative control: without heartbeats, the same reports (rank 1 and a
blocked survivor both silent) name no rank, which is what the survivors said before.
"""

import time

import pytest

from ds_hetero.testing.launch import run_distributed

RAISE_WITHIN_S = 15  # after the kill; hetero_parallel.timeout_s is 40


EP = {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2, "ep": 2}}
PP = {"vision": {"dp": 2}, "language": {"pp": 2, "dp": 1}}


def _die_in_step_1(rank, world_size, tmp, stages):
    import os
    import signal

    import torch

    import ds_hetero
    from tests.helpers.moe_parity import make_batches, tiny_moe

    model = tiny_moe(seed=7)
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 0}, "steps_per_print": 10**6,
              "zero_allow_untested_optimizer": True,
              "hetero_parallel": {"micro_batches": 1, "timeout_s": 40,
                                  "stages": stages}}
    engine = ds_hetero.initialize(model, config, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    batches = make_batches(model, 2, 8)
    engine.train_batch(batches[0])
    if rank == 1:
        stage = engine.stages["language"].module
        original = stage.forward

        def forward(*args, **kwargs):
            with open(os.path.join(tmp, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        stage.forward = forward
    try:
        engine.train_batch(batches[1])
    except RuntimeError as exc:
        with open(os.path.join(tmp, "killed_at")) as f:
            after = time.time() - float(f.read())
        raise RuntimeError(f"{exc} [RAISED {after:.2f} s AFTER THE KILL]") from None


@pytest.mark.distributed
@pytest.mark.parametrize("stages", [EP, PP], ids=["tp2 dp2 ep2", "pp2"])
def test_survivors_name_the_killed_rank(tmp_path, stages):
    world_size = 4 if stages is EP else 2
    with pytest.raises(AssertionError) as info:
        run_distributed(_die_in_step_1, world_size=world_size, timeout=240, grace_s=60, tmp=str(tmp_path),
                        stages=stages)
    report = str(info.value)
    assert "rank 1 died with exit code -9" in report, report
    for rank in (r for r in range(world_size) if r != 1):
        section = report.split(f"--- rank {rank} ---")[1].split("--- rank")[0]
        assert f"ds_hetero: rank {rank}" in section and "stopped answering" in section, report
        assert "rank 1 died (e.g. was killed)" in section or "rank 1 left no report" in section, (rank, report)
        after = float(section.split("[RAISED ")[-1].split(" s AFTER")[0])
        assert after < RAISE_WITHIN_S, (rank, after, report)


class _Heartbeats:
    """A Liveness double: rank 1's heartbeat stopped, the others' move."""

    interval = 0.0
    verdict = None

    def __init__(self):
        self.published = []

    def dead_ranks(self, ranks):
        return [r for r in ranks if r == 1]

    def publish(self, text):
        self.published.append(text)


def test_heartbeats_tell_the_dead_rank_from_a_blocked_one(monkeypatch):
    """Rank 0's view: rank 3 reported; ranks 1 (dead) and 2 (blocked in a collective) did not."""
    from ds_hetero import failures

    monkeypatch.setattr(failures, "REPORT_WAIT_S", 0.0)
    monkeypatch.setattr(failures, "_write", lambda group, rank, text: None)
    monkeypatch.setattr(failures, "_read", lambda group, ranks: {3: "saw a peer stop in step 1"})
    monkeypatch.setattr(failures.dist, "get_rank", lambda: 1)  # not the store's host: no linger
    heartbeats = _Heartbeats()
    named = str(failures.peer_failure(RuntimeError("gloo"), None, [0, 1, 2, 3], 0, "language", 1, 40, heartbeats))
    assert "rank 1 died (e.g. was killed): its heartbeat stopped" in named, named
    assert heartbeats.published and "rank 1 died" in heartbeats.published[0]
    # negative control: without heartbeats the same reports name no rank (the old message)
    blind = str(failures.peer_failure(RuntimeError("gloo"), None, [0, 1, 2, 3], 0, "language", 1, 40))
    assert "no report from ranks [1, 2]" in blind and "rank 1 died" not in blind, blind
    # a survivor failing after the store's host left: the verdict its heartbeat thread kept
    monkeypatch.setattr(failures, "_read", lambda group, ranks: None)
    heartbeats.verdict = "rank 1 died (e.g. was killed): its heartbeat stopped"
    late = str(failures.peer_failure(RuntimeError("gloo"), None, [0, 1, 2, 3], 2, "language", 1, 40, heartbeats))
    assert "rank 1 died" in late, late
