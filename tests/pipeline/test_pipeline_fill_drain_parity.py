"""Colocated encoders inside the pipeline's fill and drain, against the single-process Hugging Face
reference (fp32, 5 steps of 4 micro-batches, clipping active; losses, also of the model's own
`model(**batch).loss`, within 1e-5 relative, gradient norms 1e-4, every weight tensor 1e-5).

Cases the other pipeline tests do not cover: an encoder with fewer passes than language
micro-batches (vision 2 passes of 2 micro-batches each: its rows exchange and its gradient
exchange then sit at different 1F1B steps than a micro-batch's, and its accumulation boundary
must still be hit once); two encoders (Qwen2.5-Omni vision, 4 passes, + audio at tp2 dp2 in one
pass) whose exchanges share steps; mixed placement (Qwen2.5-Omni vision dp2 on the language's
ranks 0-1, pp2, audio dp2 on ranks 2-3 of its own, which follow stage 0's order of the audio
exchanges without a 1F1B). Negative control: the rows of a pass reach its micro-batches
in reverse order; the losses then differ from the reference.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from tests.helpers.pipeline_fill_parity import suite

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3
CONTROL = "rows of a pass reversed (negative control)"


def test_fill_drain_order_matches_single_process_reference():
    results = run_distributed(suite, world_size=4, timeout=1500)
    control_seen = False
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            if name == CONTROL:
                off = max(abs(g - w) / abs(w) for g, w in zip(r["losses"], r["ref_losses"]))
                assert off > 100 * RTOL, (rank, r["losses"], r["ref_losses"])
                control_seen = True
                continue
            assert len(r["losses"]) == len(r["ref_losses"]) == len(r["hf_losses"]) == 5, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0 and err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)
    assert control_seen
