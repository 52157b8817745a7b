"""Checkpoints of a pipelined language stage meet its other features (one 4-rank launch,
tests/helpers/pipeline_feature_checkpoints.py):

- tied input/output embeddings: the first chunk's copy of the tied weight is the one saved in the
  full state (the head's copy on the last chunk is marked, not saved twice); the same layout
  resumes bit-exactly, and pp2 -> pp1 (tp 2), pp1 -> pp2 [1, 3] tp2 and pp2 tp2 -> pp2 dp2
  continue like a single-process Hugging Face run from the same full state, with both copies
  equal to the bit after the load and the steps that follow (both restored, with their optimizer
  state, from the one saved tensor); `convert --to-hf` of the pp2 checkpoint gives a tied model
  with the live weights;
- ZeRO 3: the same layout resumes bit-exactly, `save_pretrained` writes the live weights and
  per-shard loading (`weights=`) reads them back into the pipelined layout, and a layout change
  is refused on every rank.

Negative controls: the head's copy left out of the reshard (the copies differ, the
continuation misses the reference); a last chunk whose head is not marked as the copy is refused ("saved by
chunks 0 and 1") with nothing changed; the continuation without Adam's moments differs; the
saved weights differ from the untrained ones.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

RTOL = 1e-5


def _merge(results, key):
    import torch

    state = {}
    for r in results:
        state.update({n: {k: (torch.from_numpy(v) if hasattr(v, "shape") else v) for k, v in e.items()}
                      for n, e in r.get(key, {}).items()})
    return state


def _assert_close(got, want, what):
    assert len(got) == len(want) == 2, (what, got, want)
    for g, w in zip(got, want):
        assert abs(g - w) <= RTOL * abs(w), (what, got, want)


def _copies_equal(tied, key, ranks):
    """The ranks holding a copy of the tied weight after run `key`: which, and all equal to the bit."""
    copies = [(rank, r[key]) for rank, r in enumerate(tied) if r[key] is not None]
    assert [rank for rank, _ in copies] == ranks, (key, [rank for rank, _ in copies])
    assert {c["shared"] for _, c in copies} == {False, True}, key
    assert all(c["value"] == copies[0][1]["value"] for _, c in copies), (key, "the copies differ")


def test_tied_and_zero3_pipeline_checkpoints(tmp_path):
    from ds_hetero.testing.parity import build_model
    from tests.helpers.checkpoint_reference import continue_single_process
    from tests.helpers.pipeline_feature_checkpoints import STEPS, TIED, batches, feature_chains

    results = run_distributed(feature_chains, world_size=4, timeout=1800, tmp=str(tmp_path))
    tied = [r["tied"] for r in results]
    t0 = tied[0]
    data = batches(TIED)
    second, third, fourth = (data[i * STEPS:(i + 1) * STEPS] for i in (1, 2, 3))
    names = {n for n, _ in build_model("llava", seed=7, **TIED).named_parameters()}

    # the tied weight is one model parameter: the full state has it once, under the model's name
    state_ta = _merge(tied, "state_ta")
    assert set(state_ta) == names
    reference = continue_single_process(state_ta, second, **TIED)
    _assert_close(t0["ta_losses"], reference, "tied pp2 uninterrupted vs single process from its state")
    # same layout: DeepSpeed's per-chunk load, the uninterrupted run's losses and copies exactly
    assert all(r["ta2_losses"] == t0["ta_losses"] and r["ta2_step"] == STEPS for r in tied)
    assert [r["ta2_copy"] for r in tied] == [r["ta_copy"] for r in tied]
    _copies_equal(tied, "ta2_copy", [0, 1, 2, 3])  # pp2 dp2: ranks 0, 1 embed, 2, 3 head
    _assert_close(t0["tb_losses"], reference, "tied pp2 dp2 ZeRO 1 -> pp1 tp2 dp2 ZeRO 2")
    assert all(r["tb_step"] == STEPS and r["tc_step"] == 2 * STEPS and r["td_step"] == 3 * STEPS for r in tied)

    state_tb = _merge(tied, "state_tb")
    assert set(state_tb) == names
    _assert_close(t0["tc_losses"], continue_single_process(state_tb, third, **TIED),
                  "tied pp1 tp2 dp2 ZeRO 2 -> pp2 [1,3] tp2 ZeRO 0")
    _copies_equal(tied, "tc_copy", [0, 1, 2, 3])  # pp2 tp2: ranks 0, 1 embed, 2, 3 head
    # negative control: the head's copy not restored from the saved tensor: the copies differ and
    # the continuation misses the reference
    with pytest.raises(AssertionError, match="the copies differ"):
        _copies_equal(tied, "tx_copy", [0, 1, 2, 3])
    with pytest.raises(AssertionError):
        _assert_close(t0["tx_losses"], continue_single_process(state_tb, third, **TIED), "control")
    state_tc = _merge(tied, "state_tc")
    assert set(state_tc) == names
    _assert_close(t0["td_losses"], continue_single_process(state_tc, fourth, **TIED),
                  "tied pp2 [1,3] tp2 ZeRO 0 -> pp2 [2,2] dp2 ZeRO 1")
    _copies_equal(tied, "td_copy", [0, 1, 2, 3])
    assert all(r["td_losses"] == t0["td_losses"] for r in tied)

    # `ds-hetero checkpoint convert --to-hf` of the tied pp2 checkpoint: one tied tensor, the live weights
    import torch
    from transformers import AutoModelForImageTextToText

    from ds_hetero.checkpoint.hf_convert import convert_to_hf

    converted = AutoModelForImageTextToText.from_pretrained(convert_to_hf(tmp_path / "ckpt_ta", tmp_path / "hf_ta"),
                                                            dtype=torch.float32)
    assert converted.lm_head.weight is converted.get_input_embeddings().weight
    files = {n: p.detach() for n, p in converted.named_parameters()}
    assert set(files) == names and max((files[n] - state_ta[n]["fp32"]).abs().max().item() for n in names) == 0.0

    # negative control: without the Adam moments the continuation misses the tolerance (by ~20x
    # here: the tied model's second step moves less than the untied one's)
    fresh = continue_single_process(state_ta, second, moments=False, **TIED)
    assert max(abs(g - w) / abs(w) for g, w in zip(t0["tb_losses"], fresh)) > 10 * RTOL, (t0["tb_losses"], fresh)
    # negative control: the head's copy not marked as one is a parameter saved twice, refused everywhere
    for r in tied:
        assert r["refused"] is not None and "saved by chunks 0 and 1" in r["refused"], r["refused"]
        assert r["unchanged"], "a refused load changed weights"

    zero3 = [r["zero3"] for r in results]
    z0 = zero3[0]
    # same layout: the uninterrupted run's losses exactly, on every rank
    assert all(r["z2_losses"] == z0["z_losses"] and r["z2_step"] == STEPS for r in zero3), \
        [(r["z2_losses"], z0["z_losses"]) for r in zero3]
    # save_pretrained: the files hold every rank's live weights; per-shard loading reads them back
    assert z0["hf_names"] and z0["hf_diff"] == 0.0, z0
    assert z0["hf_control"] > 1e-3, z0  # they trained: the check can fail
    for rank, r in enumerate(zero3):
        assert r["z3_same_names"] and r["z3_diff"] == 0.0, (rank, r["z3_diff"])
        # the weights alone (no optimizer state): the first step's loss is the uninterrupted one
        assert r["z3_losses"][0] == z0["z_losses"][0], (r["z3_losses"], z0["z_losses"])
        assert r["z4_refused"] is not None and "ZeRO stage 3" in r["z4_refused"], r["z4_refused"]
