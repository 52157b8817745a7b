"""Gemma 3 and Gemma 4 packed (`language_batching` "packed") against the single-process Hugging Face
reference on the UNPACKED batch, with the model's own loss (tests/helpers/gemma_packing_parity.py).

One 4-rank launch, fp32, 5 steps, AdamW, clipping active: losses 1e-5 relative, grad norms 1e-4, every
weight 1e-5, boundary bytes at the lower bound, for
- Gemma 3: vision dp4 + language tp2 dp2, 2 micro-batches, ZeRO 1; and language tp2 pp2, 4 micro-batches;
- Gemma 4: vision dp4 + audio dp4 + language tp2 dp2, 2 micro-batches, ZeRO 1 (images, audio clips, both,
  neither; per-layer inputs, kv-shared layers, the final softcap).
Each packed run's language rows held several samples, and every attention call carried each sample's
own masks (image blocks, sliding windows: models/sample_masks.py). The tiny models' window is 4 tokens,
shorter than every sample, so the windows act inside samples.
Negative controls, for both families (3 steps): the whole row under one causal mask (attention and the
windows cross samples), and each sample without its bidirectional image blocks; each misses the bar.
"""

import pytest

from tests.helpers.family_checks import CLIP, RTOL, check_family_parity
from tests.helpers.gemma_packing_parity import CONTROLS

pytestmark = pytest.mark.distributed

G3 = "gemma3 packed vision dp4 + language tp2dp2, 2 micro-batches, zero1 adamw"
G3_PP = "gemma3 packed vision dp4 + language tp2 pp2, 4 micro-batches, zero1 adamw"
G4 = "gemma4 packed vision dp4 + audio dp4 + language tp2dp2, 2 micro-batches, zero1 adamw"
RUNS = {
    G3: dict(family="gemma3", layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=1, steps=5,
             clip=CLIP, micro_batches=2),
    G3_PP: dict(family="gemma3", layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2}},
                zero_stage=1, steps=5, clip=CLIP, micro_batches=4),
    G4: dict(family="gemma4", layout={"vision": {"dp": 4}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}},
             zero_stage=1, steps=5, clip=CLIP, micro_batches=2),
}
CONTROL_RUNS = {f"control: {name}, {c}": dict(RUNS[name], steps=3, control=c, right=name)
                for name in (G3, G4) for c in CONTROLS}


@pytest.fixture(scope="module")
def runs():
    from ds_hetero.testing.cases import launch_cases
    from tests.helpers.gemma_packing_parity import train_packed_gemma

    cases = {name: (train_packed_gemma, {k: v for k, v in kw.items() if k != "right"})
             for name, kw in {**RUNS, **CONTROL_RUNS}.items()}
    return launch_cases(cases, world_size=4, timeout=1800)


def _packed(r, own_masks=True):
    """The run packed (a row held several samples) and, where right, each call carried the samples' masks."""
    assert r["most_in_a_row"] and max(r["most_in_a_row"]) >= 2, r["most_in_a_row"]
    assert all(r["own_masks"]) if own_masks else not any(r["own_masks"]), r["own_masks"]


def _report(name, rs, capsys):
    """The worst distances over the ranks (what docs/packing.md quotes)."""
    worst = {k: max(distance(r)[k] for r in rs) for k in ("loss", "norm", "weight")}
    with capsys.disabled():
        print(f"\n{name}: {worst}")


def test_packed_gemma3_matches_the_single_process_reference(runs, capsys):
    for name in (G3, G3_PP):
        for r in runs[name]:
            _packed(r)
        _report(name, runs[name], capsys)
    check_family_parity([{G3: a, G3_PP: b} for a, b in zip(runs[G3], runs[G3_PP])])


def test_packed_gemma4_matches_the_single_process_reference(runs, capsys):
    for r in runs[G4]:
        _packed(r)
    _report(G4, runs[G4], capsys)
    # the project's bar (1e-5); tests/families/test_families_gemma4.py holds unpacked Gemma 4 to 3e-5, as one
    # AMD EPYC machine's fp32 rounding reached 1.08e-5 there; this run measured 5.9e-6 (2-core Intel machine)
    check_family_parity([{G4: r} for r in runs[G4]])


def distance(r) -> dict:
    """How far a run ends from the reference: the worst relative loss, grad norm and weight errors."""
    rel = lambda key: max(abs(g - w) / abs(w) for g, w in zip(r[key], r[f"ref_{key}"]))  # noqa: E731
    return {"loss": rel("losses"), "norm": rel("norms"), "weight": r["weight_err"][0]}


@pytest.mark.parametrize("name", list(CONTROL_RUNS))
def test_wrong_packed_masks_miss_the_bar(runs, name, capsys):
    for r, right in zip(runs[name], runs[CONTROL_RUNS[name]["right"]]):
        if name.endswith(CONTROLS[0]):  # the rows the right run packed (same plan), each one segment here
            assert set(r["most_in_a_row"]) == {1} and max(right["most_in_a_row"]) >= 2, r["most_in_a_row"]
            assert not any(r["own_masks"]), r["own_masks"]
        else:
            _packed(r, own_masks=False)
    d = [distance(r) for r in runs[name]]
    with capsys.disabled():
        print(f"\n{name}: {d[0]}")
    for r in d:
        assert r["loss"] > 10 * RTOL and r["weight"] > 100 * RTOL, (name, r)
