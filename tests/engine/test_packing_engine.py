"""Packed, token-balanced language micro-batches against the single-process reference.

The reference is the unmodified Hugging Face model on the UNPACKED, padded batch
(`model(**batch).loss`); the engine packs each language dp rank's samples into packed rows with
positions restarting per sample (tests/helpers/packing_parity.py). fp32, 5 steps, clipping
active: losses 1e-5 relative, grad norms 1e-4, every weight 1e-5; boundary bytes equal the
lower bound. The model runs sdpa, so by default every sample gets its own attention call in one
row per rank (models/per_sample_attention.py; checked: the mode, the language ranks' attention
modules calling it, no padding); runs named "row_mask" take `packed_attention: "row_mask"`, the
whole row under the block-diagonal mask, in the rows that cost that least (step/rows.py), which
hold some rank's samples out of batch order (checked), delivered by the boundary in the rows' order.
LLaVA with tp2 dp2, sp, cp2 (ZeRO 0), pp2, first_stage (row_mask) and disaggregated, and with an
empty sample (no token) in every batch under a token budget (it gets no position and no attention call); Qwen2-VL (variable
image tokens, text-only samples) with tp2 dp2 ZeRO 2 (row_mask) and dp4 ZeRO 3 under a token budget
(several rows, padding segments). Across micro-batches (the samples go to (micro-batch, dp rank)
bins of the whole batch): batches sorted longest first, so the samples cut's first micro-batch holds
every long sample, 4 micro-batches of 16 samples: LLaVA with one vision pass feeding all four (the
pass takes their union), Qwen2-VL with pp2 (1F1B shapes per micro-batch) and with cp2 + sp (both
attentions); the skewed runs must move samples out of their samples-cut micro-batch. Negative
controls: positions not restarted (attention and RoPE across samples: the per-sample attention
takes each row as one segment), per sample on LLaVA and row_mask on Qwen2-VL, and the loss taken
across a sample boundary, each far from the reference.
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.packing_parity import loader_pair, train_packed
from tests.helpers.parity_checks import RTOL, check_parity

pytestmark = pytest.mark.distributed

V4 = {"dp": 4}
L22 = {"tp": 2, "dp": 2}
CONTROLS = ("positions not restarted", "loss across samples")
ROW_MASK = {"packed_attention": "row_mask"}


def _llava_suite(rank, world_size):
    runs = {
        "llava packed vision dp4 + language tp2dp2 zero1 adamw": dict(
            layout={"vision": V4, "language": L22}, optimizer="adamw"),
        "llava packed vision dp4 + language tp2 sp dp2 zero2 sgd": dict(
            layout={"vision": V4, "language": {**L22, "sequence_parallel": True}}, zero_stage=2),
        "llava packed disaggregated vision dp2 (0-1) + language dp2 (2-3) zero1 sgd": dict(
            layout={"vision": {"dp": 2}, "language": {"dp": 2}}, placement="disaggregated"),
        "llava packed vision dp4 + language cp2dp2 zero0 sgd": dict(
            layout={"vision": V4, "language": {"cp": 2, "dp": 2}}, zero_stage=0),
        "llava packed vision dp4 + language pp2dp2 zero1 sgd": dict(
            layout={"vision": V4, "language": {"dp": 2, "pp": 2}}),
        "llava packed row_mask first_stage vision tp2 + language pp2tp2 zero1 adamw": dict(
            layout={"vision": {"tp": 2, "dp": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}}, optimizer="adamw",
            placement="first_stage", micro_batches=4, hetero=ROW_MASK),
        "llava packed, an empty sample in every batch, rows of <= 40 tokens, vision dp4 + language tp2dp2 zero1 sgd":
            dict(layout={"vision": V4, "language": L22}, steps=3, empty_sample=True,
                 hetero={"max_tokens_per_micro_batch": 40}),
        "llava packed skewed, 4 micro-batches, one vision pass dp4 + language tp2dp2 zero1 sgd": dict(
            layout={"vision": {"dp": 4, "micro_batches": 1}, "language": L22}, micro_batches=4, batch_size=16,
            skewed=True),
    }
    out = {name: train_packed(rank, world_size, "llava", **kw) for name, kw in runs.items()}
    for kind in CONTROLS:
        out[f"control: {kind}"] = train_packed(rank, world_size, "llava", {"vision": V4, "language": L22},
                                               steps=2, control=kind)
    return out


def _qwen_suite(rank, world_size):
    runs = {
        "qwen2-vl packed row_mask vision dp4 + language tp2dp2 zero2 sgd": dict(
            layout={"vision": V4, "language": L22}, zero_stage=2, hetero=ROW_MASK),
        "qwen2-vl packed vision tp2dp2 + language dp4, one micro-batch, rows of <= 20 tokens, zero3 sgd": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"dp": 4}}, zero_stage=3, micro_batches=1,
            hetero={"max_tokens_per_micro_batch": 20}),
        "qwen2-vl packed skewed, 4 micro-batches, vision dp4 + language pp2dp2 zero1 sgd": dict(
            layout={"vision": V4, "language": {"dp": 2, "pp": 2}}, micro_batches=4, batch_size=16, skewed=True),
        "qwen2-vl packed skewed, 4 micro-batches, vision dp4 + language tp2 cp2 sp zero1 sgd": dict(
            layout={"vision": V4, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
            micro_batches=4, batch_size=16, skewed=True),
        "qwen2-vl packed row_mask skewed, 4 micro-batches, vision dp4 + language tp2 cp2 sp zero1 sgd": dict(
            layout={"vision": V4, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
            micro_batches=4, batch_size=16, skewed=True, hetero=ROW_MASK),
    }
    out = {name: train_packed(rank, world_size, "qwen2_vl", **kw) for name, kw in runs.items()}
    out["control: positions not restarted, row_mask"] = train_packed(
        rank, world_size, "qwen2_vl", {"vision": V4, "language": {"dp": 2, "tp": 2}}, steps=2,
        control="positions not restarted", hetero=ROW_MASK)
    return out


def _check(results):
    good = [{n: r for n, r in per_rank.items() if not n.startswith("control")} for per_rank in results]
    check_parity(good)
    for per_rank in good:
        for name, r in per_rank.items():
            assert max(r["most_in_a_row"]) > 1, (name, "no row held two samples: nothing was packed")
            got, want = r["eval"]  # eval_batch packs as training does
            assert abs(got - want) <= RTOL * abs(want), (name, r["eval"])
            if "skewed" in name:  # the long samples of the first micro-batch were spread over the others
                assert r["moved"] > 0, (name, r["moved"])
            if "row_mask" in name:
                # sdpa scores rows whole: some rank's balanced rows hold its samples out of batch
                # order, and the boundary delivers in the rows' order; no module calls per sample
                assert r["mode"] == "row_mask" and not r["per_sample_modules"], (name, r["mode"])
                assert r["reordered"] > 0, (name, r["reordered"])
            else:  # the default under sdpa: each sample's own attention, one row per rank (or the budget's)
                assert r["mode"] == "per_sample", (name, r["mode"])
                assert r["per_sample_modules"] or not r["held"], (name, r["per_sample_modules"])
                if "rows of" not in name:  # no padding (the figure leaves out the shard rounding)
                    assert r["real_computed"] == 1.0, (name, r["real_computed"])
    for per_rank in results:
        for name, r in per_rank.items():
            if name.startswith("control"):
                loss_err = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"]))
                rel = r["weight_err"][0]
                assert loss_err > 100 * RTOL or rel > 100 * RTOL, (name, loss_err, rel)
    return good


@pytest.fixture(scope="module")
def launched():
    cases = {"llava": (_llava_suite, {}), "qwen2_vl": (_qwen_suite, {}),
             "loader": (loader_pair, {"layout": {"vision": V4, "language": L22}})}
    return launch_cases(cases, world_size=4, timeout=2400)


def test_llava_packed_matches_single_process_reference(launched):
    _check(launched["llava"])


def test_qwen2_vl_packed_matches_single_process_reference(launched):
    _check(launched["qwen2_vl"])


def test_packed_through_the_engines_loader_equals_the_samples_cut(launched):
    for r in launched["loader"]:
        samples, packed = r["samples"], r["packed"]
        for a, b in zip(packed["losses"], samples["losses"]):
            assert abs(a - b) <= RTOL * abs(b), (packed["losses"], samples["losses"])
        for a, b in zip(packed["norms"], samples["norms"]):
            assert abs(a - b) <= 1e-4 * abs(b), (packed["norms"], samples["norms"])
        for p, s in zip(packed["load"], samples["load"]):  # the same tokens, less padding
            assert p["real"] == s["real"] and p["computed"] <= s["computed"], (p, s)
