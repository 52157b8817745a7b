"""Checkpoints of a pipelined language stage: each chunk's engine saves its own DeepSpeed files and
the manifest records the layer cut, so a checkpoint moves across the cut (pp2 -> pp1, pp1 -> pp2,
pp2 [1, 3] -> pp2 [2, 2], with tp, dp and ZeRO changing too) and continues exactly like a
single-process Hugging Face run from the same full state (tests/helpers/checkpoint_reference.py);
the same layout resumes bit-exactly; a disaggregated pp3 continues from a colocated pp2
checkpoint, and `convert --to-hf` merges a pp3 checkpoint's chunks into the live weights. One 4-rank launch (tests/helpers/pipeline_checkpoints.py).

Negative controls: a manifest whose cut disagrees with the chunks' recorded layers is refused on
every rank with nothing changed; the continuation without Adam's moments differs.
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


def test_pipeline_checkpoints_move_across_the_layer_cut(tmp_path):
    from ds_hetero.testing.parity import build_model
    from tests.helpers.checkpoint_reference import continue_single_process
    from tests.helpers.pipeline_checkpoints import FOUR_LAYERS, STEPS, batches, chain

    results = run_distributed(chain, world_size=4, timeout=1500, tmp=str(tmp_path))
    r0 = results[0]
    data = batches()
    second, third, fourth = (data[i * STEPS:(i + 1) * STEPS] for i in (1, 2, 3))
    names = {n for n, _ in build_model("llava", seed=7, **FOUR_LAYERS).named_parameters()}

    # every chunk saved its own files, the embeddings with chunk 0 and the head with the last
    assert r0["a_files"] == ["pp_00", "pp_01"] and r0["c_files"] == ["pp_00", "pp_01"], (r0["a_files"], r0["c_files"])
    assert r0["b_files"][0] == "global_step4" and "params.json" in r0["b_files"], r0["b_files"]

    state_a = _merge(results, "state_a")
    assert set(state_a) == names  # the chunks' first ranks together hold the whole model
    reference = continue_single_process(state_a, second, **FOUR_LAYERS)
    # the reference state is right: the uninterrupted run continues like it
    _assert_close(r0["a_losses"], reference, "pp2 uninterrupted vs single process from its state")
    # same layout: DeepSpeed's own per-chunk load, the uninterrupted run's losses exactly
    assert all(r["a2_losses"] == r0["a_losses"] and r["a2_step"] == STEPS for r in results), \
        [(r["a2_losses"], r0["a_losses"]) for r in results]
    _assert_close(r0["b_losses"], reference, "pp2 [2,2] dp2 ZeRO 1 -> pp1 tp2 dp2 ZeRO 2")
    assert all(r["b_step"] == STEPS and r["c_step"] == 2 * STEPS and r["d_step"] == 3 * STEPS for r in results)

    state_b = _merge(results, "state_b")
    assert set(state_b) == names
    _assert_close(r0["c_losses"], continue_single_process(state_b, third, **FOUR_LAYERS),
                  "pp1 tp2 dp2 ZeRO 2 -> pp2 [1,3] tp2 ZeRO 0")
    state_c = _merge(results, "state_c")
    assert set(state_c) == names
    _assert_close(r0["d_losses"], continue_single_process(state_c, fourth, **FOUR_LAYERS),
                  "pp2 [1,3] tp2 ZeRO 0 -> pp2 [2,2] dp2 ZeRO 1")
    assert all(r["d_losses"] == r0["d_losses"] for r in results)  # every rank learns the step's loss
    # disaggregated, vision on rank 0 and language pp3 [2, 1, 1] on ranks 1-3, from the same checkpoint
    assert [r["e_held"] for r in results] == [["vision"]] + [["language"]] * 3
    _assert_close(r0["e_losses"], continue_single_process(state_c, fourth, **FOUR_LAYERS),
                  "colocated pp2 [1,3] tp2 ZeRO 0 -> disaggregated pp3 [2,1,1] ZeRO 1")
    assert all(r["e_losses"] == r0["e_losses"] for r in results)
    assert r0["e_files"] == ["pp_00", "pp_01", "pp_02"], r0["e_files"]

    # `ds-hetero checkpoint convert --to-hf` merges the three chunks' files: the live weights
    import torch
    from transformers import AutoModelForImageTextToText

    from ds_hetero.checkpoint.hf_convert import convert_to_hf
    from ds_hetero.checkpoint.manifest import format_manifest, read_manifest

    state_e = _merge(results, "state_e")
    hf = convert_to_hf(tmp_path / "ckpt_e", tmp_path / "hf_e")
    files = {n: p.detach() for n, p in
             AutoModelForImageTextToText.from_pretrained(hf, dtype=torch.float32).named_parameters()}
    assert set(files) == set(state_e) == names
    assert max((files[n] - state_e[n]["fp32"]).abs().max().item() for n in names) == 0.0
    assert max((files[n] - state_c[n]["fp32"]).abs().max().item() for n in names) > 0  # it trained on
    info = format_manifest(read_manifest(tmp_path / "ckpt_e"))
    assert "language  tp1 cp1 dp1 pp3 layers [2, 1, 1] ranks [1, 2, 3]" in info, info

    # negative control: without the Adam moments the continuation is measurably different
    fresh = continue_single_process(state_a, second, moments=False, **FOUR_LAYERS)
    assert max(abs(g - w) / abs(w) for g, w in zip(r0["b_losses"], fresh)) > 100 * RTOL, (r0["b_losses"], fresh)

    # negative control: a manifest whose cut disagrees with the chunks' layers is refused everywhere
    for r in results:
        assert r["refused"] is not None and "wrong layer map" in r["refused"], r["refused"]
        assert r["unchanged"], "a refused load changed weights"
    assert "pp2 layers [2, 2]" in r0["refused"], r0["refused"]
