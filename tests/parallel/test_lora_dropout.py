"""LoRA dropout (PEFT's and ms-swift's default 0.05) at language and encoder tp > 1.

The mask on a replicated activation (a column-parallel LoRA layer's input) comes from the stage's
replicated stream: the same on every tp rank of the stage, different over its dp ranks; the mask on a
sharded one (a row-parallel layer's input slice) from the sharded stream, different per tp rank
(tensor_parallel/rng.py, lora_dropout.py). One 4-rank launch (tests/helpers/lora_dropout_checks.py):

    masks    every mask drawn in 2 training steps of tiny LLaVA (vision tp2 dp2 + language tp2 dp2):
             replicated masks equal on the tp peers, sharded ones differ, dp ranks differ, ~p dropped
    layer    a column + row LoRA pair under tp2 equals the unsharded PEFT pair given the masks the tp
             ranks drew: output and every gradient to 1e-5 relative (negative controls: no dropout in the
             reference, or this rank's row mask taken as the whole one, differ by > 1e-2)
    recompute  `recompute: true` on both stages gives the run without recompute (control: streams not restored)
    curve    20 steps at dropout 0.05 (vision dp4 + language tp2 dp2) on the shapes captions against the stock
             single-process PEFT run with the same dropout under 4 seeds (see test_curve_within_dropout_noise)

Exact parity with the HF reference at lora_dropout=0 stays in tests/parallel/test_lora.py (the dropout module
is only installed where p > 0). Pure tests: the streams' seeding, the dropout's scaling, recompute.
"""

import pytest
import torch

from ds_hetero.tensor_parallel.lora_dropout import TensorParallelDropout
from ds_hetero.tensor_parallel.rng import StageRNG
from ds_hetero.testing.cases import launch_cases
from ds_hetero.layout import Coord


def _draw(rng, sharded, shape=(256,)):
    return torch.empty(shape).bernoulli_(0.5, generator=rng.generator(torch.device("cpu"), sharded))


def test_streams_equal_over_tp_and_distinct_over_everything_else():
    base = StageRNG(3, "language", Coord(tp=0, cp=0, dp=0))
    peer = StageRNG(3, "language", Coord(tp=1, cp=0, dp=0))
    assert torch.equal(_draw(base, False), _draw(peer, False))  # replicated: the tp rank does not enter
    assert not torch.equal(_draw(StageRNG(3, "language", Coord(0, 0, 0)), True),
                           _draw(StageRNG(3, "language", Coord(1, 0, 0)), True))  # sharded: it does
    for other in (StageRNG(3, "language", Coord(0, 0, 1)), StageRNG(3, "language", Coord(0, 1, 0)),
                  StageRNG(3, "language", Coord(0, 0, 0, 1)), StageRNG(3, "vision", Coord(0, 0, 0)),
                  StageRNG(4, "language", Coord(0, 0, 0))):
        assert not torch.equal(_draw(StageRNG(3, "language", Coord(0, 0, 0)), False), _draw(other, False))


def test_streams_restart_per_step_so_a_resume_draws_the_same():
    run = StageRNG(3, "vision", Coord(0, 0, 0))
    first = [_draw(run, False) for _ in range(2)]
    run.start_step(1)
    second = _draw(run, False)
    resumed = StageRNG(3, "vision", Coord(0, 0, 0))
    resumed.start_step(1)
    assert torch.equal(_draw(resumed, False), second)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[0], second)
    run.start_step(0)
    assert torch.equal(_draw(run, False), first[0])


def test_dropout_scales_as_torch_and_is_off_in_eval():
    rng = StageRNG(0, "language", Coord(0, 0, 0))
    drop = TensorParallelDropout(0.25, rng, sharded=False)
    x = torch.ones(20000)
    y = drop(x)
    kept = y[y != 0]
    assert torch.equal(kept, torch.full_like(kept, 1) / 0.75)  # as F.dropout: x * mask / (1 - p)
    assert abs(float((y == 0).float().mean()) - 0.25) < 0.02
    assert torch.equal(drop.eval()(x), x)
    assert torch.equal(TensorParallelDropout(1.0, rng, False)(x), torch.zeros_like(x))


def test_recompute_replays_the_stage_streams():
    """A checkpointed layer with the stage's dropout gets the gradient of the masks its forward drew
    (context_fn restores the streams); without it the recompute draws new masks (the control)."""
    import torch.utils.checkpoint as cp

    def grads(context):
        rng = StageRNG(1, "language", Coord(0, 0, 0))
        drop = TensorParallelDropout(0.5, rng, sharded=False)
        w = torch.nn.Parameter(torch.linspace(-1, 1, 64))
        f = lambda: (drop(w) * drop(w.flip(0))).sum()  # noqa: E731
        extra = {"context_fn": rng.checkpoint_contexts} if context else {}
        out = f() if context is None else cp.checkpoint(f, use_reentrant=False, **extra)
        out.backward()
        return float(out.detach()), w.grad.clone(), _draw(rng, False)

    plain, replayed, redrawn = grads(None), grads(True), grads(False)
    assert replayed[0] == plain[0] and torch.equal(replayed[1], plain[1])
    assert torch.equal(replayed[2], plain[2])  # and the stream continues where the forward left it
    assert not torch.equal(redrawn[1], plain[1])


@pytest.fixture(scope="module")
def launched():
    from tests.helpers.lora_dropout_checks import curve, layer, masks, recompute

    cases = {"masks": (masks, {}), "layer": (layer, {}), "recompute": (recompute, {}), "curve": (curve, {})}
    return launch_cases(cases, world_size=4, timeout=1800)


@pytest.mark.distributed
def test_masks_equal_over_tp_peers_and_distinct_over_dp(launched):
    ranks = launched["masks"]
    for stage in ("vision", "language"):
        coords = {r: tuple(ranks[r]["stages"][stage]["coord"]) for r in range(4)}
        modules = ranks[0]["stages"][stage]["modules"]
        # 2 layers x (6 tower | 7 decoder) LoRA linears
        assert len(modules) == (12 if stage == "vision" else 14), len(modules)
        for r in range(4):
            for s in range(r + 1, 4):
                tp_peers = coords[r][1:] == coords[s][1:]
                for name, sharded in modules.items():
                    a, b = ranks[r]["drawn"][name], ranks[s]["drawn"][name]
                    assert len(a) == len(b) > 0
                    if tp_peers and not sharded:
                        assert a == b, (stage, name, r, s)
                    else:  # sharded over tp, or another dp rank: every draw differs
                        assert all(x != y for x, y in zip(a, b)), (stage, name, r, s)
                for sharded in (False, True):
                    same = ranks[r]["same_shape"][f"{stage}:{sharded}"] == ranks[s]["same_shape"][f"{stage}:{sharded}"]
                    assert same == (tp_peers and not sharded), (stage, sharded, r, s)
    for r in ranks:
        dropped, total = r["dropped"]
        assert abs(dropped / total - 0.1) < 0.01, dropped / total


@pytest.mark.distributed
def test_sharded_lora_pair_with_dropout_equals_the_unsharded_pair(launched):
    for r in launched["layer"]:
        assert max(r["errors"].values()) < 1e-5, r["errors"]
        for name, errors in r["controls"].items():
            assert errors["output"] > 1e-2, (name, errors)
        assert 0.6 < r["kept"] < 0.8


@pytest.mark.distributed
def test_recompute_replays_the_dropout_masks_in_the_engine(launched):
    """`recompute: true` on both tp2 stages trains exactly as without it (the streams restored for
    every recomputed layer); with the restore switched off the gradients differ."""
    for r in launched["recompute"]:
        plain, again, control = r["plain"], r["recompute"], r["not restored"]
        assert again["losses"] == pytest.approx(plain["losses"], rel=1e-6)
        assert again["norms"] == pytest.approx(plain["norms"], rel=1e-6)
        assert control["norms"][0] != pytest.approx(plain["norms"][0], rel=1e-3), (control, plain)


@pytest.mark.distributed
def test_curve_within_dropout_noise(launched):
    """Two runs that draw different masks cannot agree to fp32 rounding: how far apart two stock runs
    with different seeds (the same data, weights and optimizer; only the masks differ) land is the
    noise. Tolerance: the mean over the 20 steps of |ds_hetero's loss - the 4 stock seeds' mean loss|
    below the largest mean |difference| between two stock seeds (an exchangeable fifth run's distance
    to the mean of four is expected at about 0.8 of a typical pairwise distance). Negative controls:
    stock runs that train differently, lr x 2 and dropout 0.5, exceed it (measured about 1.6 and 3 times it)."""
    import itertools

    losses = [r["losses"] for r in launched["curve"]]
    assert all(l == losses[0] for l in losses)
    r0 = launched["curve"][0]
    stock = list(r0["stock"].values())
    ours, steps = losses[0], len(losses[0])

    def mean_diff(a, b):
        return sum(abs(x - y) for x, y in zip(a, b)) / steps

    noise = max(mean_diff(a, b) for a, b in itertools.combinations(stock, 2))
    mean_stock = [sum(s[t] for s in stock) / len(stock) for t in range(steps)]
    assert mean_stock[-1] < mean_stock[0] - 0.3, mean_stock  # it learns
    assert mean_diff(ours, mean_stock) < noise, (mean_diff(ours, mean_stock), noise, ours, mean_stock)
    for name, control in r0["controls"].items():
        assert mean_diff(control, mean_stock) > noise, (name, mean_diff(control, mean_stock), noise)
    print(f"lora dropout curve: ds_hetero {mean_diff(ours, mean_stock):.4f}, stock pairwise noise {noise:.4f}, "
          + ", ".join(f"{n} {mean_diff(c, mean_stock):.4f}" for n, c in r0["controls"].items()))
