"""A pipelined language stage (pp > 1) on sequence shards (context parallelism, sequence
parallelism) and with ZeRO 3, against the single-process Hugging Face reference.

fp32, 5 steps of 4 micro-batches, gradient clipping active: losses within 1e-5 relative (of the
Hugging Face model's own loss too), all-stage gradient norms 1e-4, every weight tensor a rank
holds 1e-5 relative; `eval_batch` before training gives the model's first loss. Every pipeline
stage holds the same (tp, cp, dp) coordinates and sends its own sequence shard of the hidden
states (pipeline_parallel/hidden_shape.py); ZeRO 3 runs per chunk engine (pipeline_parallel/zero3.py).
Each launch carries a negative control that must fail the same comparison.
"""

import pytest

from ds_hetero.config import load_config
from ds_hetero.pipeline_parallel.hidden_shape import hidden_length
from ds_hetero.validation import check_all
from ds_hetero.testing.cases import launch_cases
from ds_hetero.layout import StageLayout
from tests.helpers.pipeline_sequence import CP_CONTROL, ZERO3_CONTROL, check_parity


@pytest.mark.parametrize("tp,cp,sp,batch_length,want", [
    (1, 1, False, 12, 12),  # no shards: the whole padded sequence
    (2, 1, False, 12, 12),  # tp without sequence parallelism: hidden states replicated over tp
    (1, 2, False, 6, 6),    # cp 2: the batch's ids are the cp chunk, so are the hidden states
    (2, 1, True, 12, 6),    # sequence parallelism: the tp sub-chunk of the (whole) sequence
    (2, 2, True, 6, 3),     # both: S/(cp*tp)
])
def test_hidden_length_is_this_ranks_shard(tp, cp, sp, batch_length, want):
    layout = StageLayout("language", tp, cp, 1, tuple(range(tp * cp * 2)), sequence_parallel=sp, pp=2)
    assert hidden_length(layout, batch_length, sharded=cp > 1 or (sp and tp > 1)) == want


@pytest.mark.parametrize("language,zero", [
    ({"cp": 2, "dp": 1, "pp": 2}, 1),
    ({"tp": 2, "dp": 1, "pp": 2, "sequence_parallel": True}, 2),
    ({"dp": 2, "pp": 2}, 3),
    ({"cp": 2, "dp": 1, "pp": 2}, 3),
])
def test_sequence_shards_and_zero3_with_a_pipeline_are_accepted(language, zero):
    """validate and initialize (the same check_all) accept what they used to refuse."""
    config = {"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": zero},
              "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4}, "language": language}}}
    check_all(load_config(config, 4))


@pytest.fixture(scope="module")
def launched():
    """Both distributed checks of this module in one 4-rank launch: {case: [its result on each rank]}."""
    from tests.helpers.pipeline_sequence import sequence_layouts, zero3_layouts

    cases = {"sequence": (sequence_layouts, {}), "zero3": (zero3_layouts, {})}
    return launch_cases(cases, world_size=4, timeout=3000)


@pytest.mark.distributed
def test_pipeline_sequence_shards_match_single_process_reference(launched):
    """pp2 cp2, pp2 tp2 with sequence parallelism (both with eval_batch), Qwen2-VL pp2 cp2, and a
    last pipeline stage that shifts its labels inside its shard (must differ)."""
    evaluated = check_parity(launched["sequence"], CP_CONTROL)
    assert evaluated == {"vision dp4 + language pp2cp2 zero1 adamw",
                         "vision dp4 + language pp2tp2 sequence_parallel zero2 sgd"}, evaluated


@pytest.mark.distributed
def test_pipeline_zero3_matches_single_process_reference(launched):
    """ZeRO 3 with pp2 dp2 (with eval_batch), pp4, pp2 cp2 and first_stage, and ZeRO 3 left to
    count micro-steps at the next forward only (must differ)."""
    evaluated = check_parity(launched["zero3"], ZERO3_CONTROL)
    assert evaluated == {"vision dp4 + language pp2dp2 zero3 adamw"}, evaluated
