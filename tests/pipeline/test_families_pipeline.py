"""Every model family with a pipelined language stage (pp 2) against the single-process Hugging Face model.

fp32, 5 steps of 4 micro-batches, clipping active: losses (the fused model's own
`model(**batch).loss`), global gradient norms (1e-4) and every weight tensor a rank holds
(1e-5 relative) on 4 ranks, AdamW (the wrong references' distance is checked with AdamW, as in
tests/engine/test_families_parity.py: with SGD Qwen2.5-VL's dropped windows move the weights by under
1e-4), with several images per sample, one, and none:
Gemma 3 (cut [1, 2]: the second chunk's layers are a full then a sliding one, at other positions
than in the whole decoder; image blocks bidirectional), Qwen3-VL (DeepStack levels in decoder
layers 0 and 1, both in the first chunk; the encoder at tp 2), Qwen2.5-VL (language pp2 tp2),
InternVL, LLaVA-OneVision (pp2 tp2), and the Qwen2.5-Omni thinker (vision and audio encoders,
TMRoPE positions). Gemma 3 with its embeddings tied (Gemma's default; the scaled input
embedding on the first pipeline stage, the head on the last), ZeRO 2. `eval_batch` on both Gemma 3
runs gives the reference's loss. Boundary bytes at the lower bound.

Negative controls: for Gemma 3, Qwen3-VL, Qwen2.5-VL, InternVL and LLaVA-OneVision a wrong
reference (image blocks causal / DeepStack levels in the wrong layers / windows dropped /
pixel shuffle transposed / tiles reversed) ends far from the engine's weights; a Gemma 3 engine
whose pipeline chunks leave the image blocks causal ends far from the reference.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from tests.helpers.family_checks import CLIP, check_family_parity

pytestmark = pytest.mark.distributed

RTOL, ATOL = 1e-5, 1e-6
GEMMA3_CAUSAL = "gemma3 chunks with a causal image mask (negative control)"


def _gemma3_causal(rank, world_size):
    """Gemma 3 at pp2 [1, 2] with the plain decoder mask in every chunk: the image blocks causal."""
    from ds_hetero.families.gemma3.adapter import Gemma3LanguageStage
    from ds_hetero.models.language_stage import LanguageStage
    from tests.helpers.family_parity import train_family

    own = Gemma3LanguageStage.decoder_mask
    Gemma3LanguageStage.decoder_mask = LanguageStage.decoder_mask
    try:
        return train_family(rank, world_size, "gemma3", {"vision": {"dp": 4},
                                                          "language": {"dp": 2, "pp": 2, "pp_layers": [1, 2]}},
                            zero_stage=1, steps=2, clip=CLIP, micro_batches=4)
    finally:
        Gemma3LanguageStage.decoder_mask = own


def _suite_vl(rank, world_size):
    from tests.helpers.family_parity import train_family

    runs = {
        "gemma3 vision dp4 + language pp2dp2 [1, 2] zero1 adamw": dict(
            family="gemma3", layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [1, 2]}},
            zero_stage=1, wrong=True, evaluate=True),
        "gemma3 tied embeddings vision dp4 + language pp2dp2 zero2 adamw": dict(
            family="gemma3", layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=2,
            model_kw={"tie_word_embeddings": True}, evaluate=True),
        "qwen3_vl vision tp2dp2 + language pp2dp2 zero2 adamw": dict(
            family="qwen3_vl", layout={"vision": {"tp": 2, "dp": 2}, "language": {"dp": 2, "pp": 2}},
            zero_stage=2, wrong=True),
        "qwen2_5_vl vision dp4 + language pp2tp2 zero1 adamw": dict(
            family="qwen2_5_vl", layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2}},
            zero_stage=1, wrong=True),
    }
    out = {name: train_family(rank, world_size, steps=5, clip=CLIP, micro_batches=4, **kw)
           for name, kw in runs.items()}
    out[GEMMA3_CAUSAL] = _gemma3_causal(rank, world_size)
    return out


def _suite_more(rank, world_size):
    from ds_hetero.testing.parity import train_both
    from tests.helpers.family_parity import train_family

    runs = {
        "internvl vision dp4 + language pp2dp2 zero1 adamw": dict(
            family="internvl", layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1,
            wrong=True),
        "llava_onevision vision tp2dp2 + language pp2tp2 zero2 adamw": dict(
            family="llava_onevision", layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 1, "pp": 2}},
            zero_stage=2, wrong=True),
    }
    out = {name: train_family(rank, world_size, steps=5, clip=CLIP, micro_batches=4, **kw)
           for name, kw in runs.items()}
    omni = train_both(rank, world_size, "omni", steps=5, clip=CLIP, micro_batches=4, zero_stage=1,
                      layout={"vision": {"dp": 4}, "audio": {"tp": 2, "dp": 2}, "language": {"dp": 2, "pp": 2}})
    omni["row_bytes"] = 1  # the thinker's two encoders: the bound is checked as a total
    out["omni vision dp4 + audio tp2dp2 + language pp2dp2 zero1 adamw"] = omni
    return out


def test_vision_families_with_a_pipelined_language_stage():
    """Gemma 3, Qwen3-VL, Qwen2.5-VL at language pp2, and Gemma 3's causal-mask negative control."""
    results = run_distributed(_suite_vl, world_size=4, timeout=1800)
    for rank, per_rank in enumerate(results):
        control = per_rank.pop(GEMMA3_CAUSAL)
        rel, where, abs_, compared = control["weight_err"]
        assert compared > 0 and rel > 100 * RTOL and abs_ > 100 * ATOL, (rank, control["weight_err"])
    check_family_parity(results)
    assert all(len(r) == 4 for r in results)
    for rank, per_rank in enumerate(results):  # eval_batch before training: the reference's first loss
        evaluated = {name: r for name, r in per_rank.items() if "eval_loss" in r}
        assert len(evaluated) == 2, (rank, list(per_rank))
        for name, r in evaluated.items():
            assert abs(r["eval_loss"] - r["ref_losses"][0]) <= RTOL * abs(r["ref_losses"][0]), (rank, name, r)


def test_more_families_with_a_pipelined_language_stage():
    """InternVL, LLaVA-OneVision and the Qwen2.5-Omni thinker at language pp2."""
    results = run_distributed(_suite_more, world_size=4, timeout=1800)
    check_family_parity(results)
    assert all(len(r) == 3 for r in results)
