"""Qwen2.5-VL and Gemma 3 split into stages reproduce the fused Hugging Face model (float64).

Each family: logits and every parameter gradient of the stage split equal the fused model's,
with variable images per sample (several, one, none); a negative control shows the comparison
can fail (Qwen2.5-VL with its windows dropped, Gemma 3 with a plain causal mask).
"""

import copy

import pytest
import torch

from ds_hetero.families import adapter_for
from ds_hetero.families.gemma3.adapter import Gemma3Adapter
from ds_hetero.families.qwen2_5_vl.adapter import Qwen2_5_VLAdapter
from ds_hetero.models.language_stage import LanguageStage
from ds_hetero.toy import tiny_gemma3, tiny_qwen2_5_vl
from tests.helpers.family_data import QWEN25_GRIDS, gemma3_samples, qwen_multi_samples
from ds_hetero.testing.batches import qwen_samples, token_loss_sum


def _qwen_fused(model, adapter, samples):
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    has = len(vision["image_grid_thw"]) > 0
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                pixel_values=vision["pixel_values"].to(model.dtype) if has else None,
                image_grid_thw=vision["image_grid_thw"] if has else None,
                mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int())
    return batch, vision, out.logits


def _gemma_fused(model, adapter, samples):
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    has = len(vision["pixel_values"]) > 0
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                pixel_values=vision["pixel_values"].to(model.dtype) if has else None,
                token_type_ids=(batch["input_ids"] == model.config.image_token_id).long())
    return batch, vision, out.logits


def _compare(model, adapter, samples, fused_fn, language=None):
    """(max logit difference, max gradient difference) of the split against the fused model."""
    batch, vision, fused = fused_fn(model, adapter, samples)
    token_loss_sum(fused, batch["labels"]).backward()
    want = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    stages = adapter.split()
    rows = stages["vision"](**{k: (v.to(model.dtype) if v.is_floating_point() else v) for k, v in vision.items()})
    lang = language or stages["language"]
    logits = lang(batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    mask = batch["attention_mask"].bool()
    logit_err = float((logits[mask] - fused[mask]).detach().abs().max())
    token_loss_sum(logits, batch["labels"]).backward()
    grad_err = 0.0
    for name, p in model.named_parameters():
        assert (p.grad is None) == (want[name] is None), name
        if p.grad is not None:
            grad_err = max(grad_err, float((p.grad - want[name]).abs().max()))
    model.zero_grad(set_to_none=True)
    return logit_err, grad_err


def test_qwen2_5_vl_split_equals_fused_with_windows_and_several_images():
    model = tiny_qwen2_5_vl(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, Qwen2_5_VLAdapter)
    samples = qwen_samples(model, QWEN25_GRIDS[:4]) + qwen_multi_samples(model, [[(1, 8, 8), (1, 4, 4)], []], seed=1)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert [adapter.image_rows(s) for s in samples] == [[16], [], [8], [12], [16, 4], []]
    logit_err, grad_err = _compare(model, adapter, samples, _qwen_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)


def test_qwen2_5_vl_negative_control_windows_dropped():
    """Full attention in every block (the window mask dropped) gives other rows: the check can fail."""
    model = tiny_qwen2_5_vl(seed=2).double()
    adapter = adapter_for(model)
    samples = qwen_samples(model, [(1, 8, 8), (1, 4, 12)])
    vision = {k: (v.double() if v.is_floating_point() else v) for k, v in adapter.vision_inputs(samples).items()}
    rows = adapter.split()["vision"](**vision)
    wrong = copy.deepcopy(model)
    wrong.model.visual.fullatt_block_indexes = list(range(model.config.vision_config.depth))
    wrong_rows = adapter_for(wrong).split()["vision"](**vision)
    assert float((rows - wrong_rows).abs().max()) > 1e-3


def test_qwen2_5_vl_cost_sees_windows():
    adapter = adapter_for(tiny_qwen2_5_vl())
    windowed = adapter_for(tiny_qwen2_5_vl(fullatt_block_indexes=(0, 1, 2)))
    # 16 rows = 64 patches = four windows of 16: windowed blocks cost less than full ones
    assert adapter.image_cost(16) < windowed.image_cost(16)
    assert adapter.image_cost(4) == windowed.image_cost(4)  # one window is the whole image


def test_gemma3_split_equals_fused_with_bidirectional_image_blocks():
    model = tiny_gemma3(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, Gemma3Adapter)
    samples = gemma3_samples(model, [2, 0, 1, 3])
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert [adapter.image_rows(s) for s in samples] == [[4, 4], [], [4], [4, 4, 4]]
    logit_err, grad_err = _compare(model, adapter, samples, _gemma_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)


def test_gemma3_negative_control_plain_causal_mask():
    """The generic language stage (causal mask only) differs: the bidirectional blocks matter."""
    model = tiny_gemma3(seed=2).double()
    adapter = adapter_for(model)
    samples = gemma3_samples(model, [2, 1])
    plain = LanguageStage(model.model.language_model, model.lm_head, model.config.image_token_id)
    logit_err, _ = _compare(model, adapter, samples, _gemma_fused, language=plain)
    assert logit_err > 1e-3


def test_gemma3_refuses_sequence_shards_and_mismatched_images():
    from ds_hetero.config import load_config
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.validation import check_model

    model = tiny_gemma3()
    cfg = load_config({"train_batch_size": 4, "hetero_parallel": {"stages": {
        "vision": {"tp": 1, "dp": 4}, "language": {"tp": 1, "cp": 2, "dp": 2}}}}, world_size=4)
    with pytest.raises(HeteroConfigError, match="bidirectionally"):
        check_model(cfg, model)
    sample = gemma3_samples(model, [2])[0]
    sample["pixel_values"] = sample["pixel_values"][:1]
    with pytest.raises(ValueError, match="8 image placeholder tokens .* 1 image"):
        adapter_for(model).check_sample(sample, 0)


def test_qwen3_vl_moe_has_an_adapter_now():
    """Refused by name until expert parallelism was built (tests/parallel/test_expert_parallel.py trains it)."""
    from ds_hetero.families.qwen3_vl_moe import Qwen3VLMoeAdapter, tiny_qwen3_vl_moe
    from ds_hetero.families.refused import REFUSED

    assert "Qwen3VLMoeForConditionalGeneration" not in REFUSED
    assert isinstance(adapter_for(tiny_qwen3_vl_moe()), Qwen3VLMoeAdapter)


def test_gemma4_has_an_adapter_now():
    """Refused by name until its adapter was built (tests/families/test_families_gemma4.py trains it)."""
    pytest.importorskip("transformers.models.gemma4")  # not in every pinned transformers
    from ds_hetero.families.gemma4 import Gemma4Adapter, tiny_gemma4
    from ds_hetero.families.refused import REFUSED

    assert "Gemma4ForConditionalGeneration" not in REFUSED
    assert isinstance(adapter_for(tiny_gemma4()), Gemma4Adapter)


def test_the_families_own_processor_output_is_accepted_as_samples():
    """Samples cut from transformers' own processors (built locally) pass check_sample and the
    split still equals the fused model on them."""
    from tests.helpers.family_processors import gemma3_processor, processor_samples, qwen2_5_vl_processor

    model = tiny_qwen2_5_vl(seed=3).double()
    adapter = adapter_for(model)
    img = "<|vision_start|><|image_pad|><|vision_end|>"
    samples = processor_samples(qwen2_5_vl_processor(model), [(f"{img} w5 w6 {img} w7", 2), ("w8 w9 w10", 0),
                                                              (f"w11 {img} w12 w13", 1)], model.config.image_token_id)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert len(adapter.image_rows(samples[0])) == 2 and adapter.image_rows(samples[1]) == []
    logit_err, grad_err = _compare(model, adapter, samples, _qwen_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12

    model = tiny_gemma3(seed=3).double()
    adapter = adapter_for(model)
    samples = processor_samples(gemma3_processor(model), [("w5 <start_of_image> w6 <start_of_image> w7", 2),
                                                          ("w8 w9", 0), ("<start_of_image> w10 w11", 1)],
                                model.config.image_token_id)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert [len(adapter.image_rows(s)) for s in samples] == [2, 0, 1]
    logit_err, grad_err = _compare(model, adapter, samples, _gemma_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12


def test_planner_spec_counts_the_families_parameters_and_sees_windows_and_pooling():
    from ds_hetero.planner.flops import vision_work
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.workload import Workload

    from ds_hetero.toy import tiny_internvl, tiny_llava_onevision, tiny_qwen3_5, tiny_qwen3_5_moe, tiny_qwen3_vl

    for model in (tiny_qwen2_5_vl(), tiny_gemma3(), tiny_qwen3_vl(), tiny_internvl(), tiny_llava_onevision(),
                  tiny_qwen3_5(), tiny_qwen3_5(tie_word_embeddings=True), tiny_qwen3_5_moe()):
        s, stages = model_spec(model.config), adapter_for(model).split()
        v = stages["vision"]
        vparams = v.trainable_parameters() if hasattr(v, "trainable_parameters") else list(v.parameters())
        assert s.vision.params() == sum(p.numel() for p in vparams), type(model).__name__
        assert s.language.params() == sum(p.numel() for p in stages["language"].parameters()), type(model).__name__
    g = model_spec(tiny_gemma3().config).vision
    assert g.tokens_per_image == 4 and g.seq_per_image() == 16  # the tower per patch, the boundary per pooled token
    i = model_spec(tiny_internvl().config).vision
    assert i.tokens_per_image == 4 and i.seq_per_image() == 17  # per tile: 16 patches + CLS, shuffled to 4
    wl = Workload(seq_len=256, image_tokens=64, global_batch=1, dtype_bytes=4)
    windowed = vision_work(model_spec(tiny_qwen2_5_vl().config), wl, samples=1, tp=1)
    full = vision_work(model_spec(tiny_qwen2_5_vl(fullatt_block_indexes=(0, 1, 2)).config), wl, samples=1, tp=1)
    assert windowed.flops < full.flops


def test_qwen3_5_split_equals_fused_with_linear_attention_layers_and_several_images():
    """Qwen3.5 (3 Gated DeltaNet layers, 1 full-attention layer): the split equals the fused model,
    with padding (the linear-attention layers zero the padded positions) and 0, 1 or 2 images."""
    from ds_hetero.families.qwen3_5.adapter import Qwen3_5Adapter
    from ds_hetero.toy import tiny_qwen3_5

    model = tiny_qwen3_5(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, Qwen3_5Adapter)
    samples = qwen_samples(model, QWEN25_GRIDS[:3]) + qwen_multi_samples(model, [[(1, 8, 8), (1, 4, 4)], []], seed=1)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    logit_err, grad_err = _compare(model, adapter, samples, _qwen_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)


def test_qwen3_vl_split_equals_fused_with_deepstack_levels():
    from ds_hetero.families.qwen3_vl.adapter import Qwen3VLAdapter
    from ds_hetero.toy import tiny_qwen3_vl

    model = tiny_qwen3_vl(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, Qwen3VLAdapter)
    assert adapter.hidden_size == 3 * model.config.text_config.hidden_size  # merged + 2 DeepStack levels
    samples = qwen_samples(model, [(1, 8, 8), None, (1, 4, 8)]) + qwen_multi_samples(model, [[(1, 4, 4), (1, 8, 4)]])
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    logit_err, grad_err = _compare(model, adapter, samples, _qwen_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)
    # every DeepStack merger got a gradient: the levels reached the decoder
    assert all(p.grad is None for p in model.parameters())  # _compare cleared them after checking


def test_qwen3_vl_negative_control_deepstack_level_to_the_wrong_layer():
    """Levels added after the wrong decoder layers (swapped) change the logits: the check can fail."""
    from ds_hetero.families.qwen3_vl.adapter import Qwen3VLLanguageStage
    from ds_hetero.toy import tiny_qwen3_vl

    class Swapped(Qwen3VLLanguageStage):
        def forward(self, input_ids, rows, *args, **kwargs):
            h = self.width
            rows = torch.cat([rows[:, :h], rows[:, 2 * h:], rows[:, h:2 * h]], dim=-1)
            return super().forward(input_ids, rows, *args, **kwargs)

    model = tiny_qwen3_vl(seed=2).double()
    adapter = adapter_for(model)
    logit_err, _ = _compare(model, adapter, qwen_samples(model, [(1, 8, 8), (1, 4, 8)]), _qwen_fused,
                            language=Swapped(model))
    assert logit_err > 1e-4


def _internvl_fused(model, adapter, samples):
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    has = len(vision["pixel_values"]) > 0
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                pixel_values=vision["pixel_values"].to(model.dtype) if has else None)
    return batch, vision, out.logits


def test_internvl_split_equals_fused_with_dynamic_tiles_and_pixel_shuffle():
    from ds_hetero.families.internvl.adapter import InternVLAdapter
    from ds_hetero.toy import tiny_internvl
    from tests.helpers.family_data import internvl_samples

    model = tiny_internvl(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, InternVLAdapter)
    samples = internvl_samples(model, [[3, 1], [], [2], [1, 1, 1]])
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    assert [adapter.image_rows(s) for s in samples] == [[12, 4], [], [8], [4, 4, 4]]
    assert adapter.image_cost(12) == 3 * adapter.image_cost(4)  # the tower's work is per tile (per patch)
    picked = adapter.select_images(samples[0], [1])["pixel_values"]
    assert torch.equal(picked, samples[0]["pixel_values"][3:4])
    logit_err, grad_err = _compare(model, adapter, samples, _internvl_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)


def test_internvl_negative_control_without_pixel_shuffle_order():
    """Rows in the wrong order inside a tile (pixel shuffle transposed) change the logits."""
    from ds_hetero.families.internvl.adapter import InternVLVisionStage
    from ds_hetero.toy import tiny_internvl
    from tests.helpers.family_data import internvl_samples

    class Transposed(InternVLVisionStage):
        def forward(self, pixel_values):
            rows = super().forward(pixel_values)
            return rows.reshape(-1, 2, 2, rows.shape[-1]).transpose(1, 2).reshape(rows.shape)

    model = tiny_internvl(seed=2).double()
    adapter = adapter_for(model)
    samples = internvl_samples(model, [[2], [1]])
    batch, vision, fused = _internvl_fused(model, adapter, samples)
    rows = Transposed(model)(vision["pixel_values"].double())
    logits = adapter.split()["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    assert float((logits - fused).detach().abs().max()) > 1e-4


def test_shapes_dataset_in_each_family_format_is_accepted():
    from ds_hetero.toy.family_formats import shapes_dataset_for
    from ds_hetero.toy import tiny_internvl, tiny_llava_onevision, tiny_qwen3_5, tiny_qwen3_vl

    onevision = tiny_llava_onevision(seed=1).double()
    for model in (tiny_qwen2_5_vl(), tiny_qwen3_vl(), tiny_qwen3_5(), tiny_gemma3(), onevision, tiny_internvl()):
        adapter = adapter_for(model)
        data = shapes_dataset_for(model.config, size=6, seed=1, text_only_every=3)
        samples = [data[i] for i in range(6)]
        for i, s in enumerate(samples):
            adapter.check_sample(s, i)
            assert torch.equal(s["input_ids"], data.input_ids(i))
        assert sum(adapter.image_rows(s) == [] for s in samples) == 2  # text-only samples
        if model is onevision:  # the format's placeholder counts are what the model's packing gives
            ov_adapter, ov_samples = adapter, [{k: (v.double() if v.is_floating_point() else v)
                                                for k, v in s.items()} for s in samples]
    rows = [adapter.image_rows(s) for s in samples]  # InternVL: 1, 2 and 4 tiles of 4 tokens
    assert rows[:2] == [[4], [8]] and rows[3] == [4]
    logit_err, grad_err = _compare(onevision, ov_adapter, ov_samples, _onevision_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12


def _onevision_fused(model, adapter, samples):
    from tests.helpers.family_data import onevision_model_inputs

    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                **onevision_model_inputs(adapter, samples, model.dtype))
    return batch, vision, out.logits


def test_llava_onevision_processor_samples_split_equals_fused_with_anyres_unpadding_newline():
    from ds_hetero.families.llava_onevision.adapter import LlavaOnevisionAdapter
    from ds_hetero.toy import tiny_llava_onevision
    from tests.helpers.family_processors import llava_onevision_processor, processor_samples

    model = tiny_llava_onevision(seed=2).double()
    adapter = adapter_for(model)
    assert isinstance(adapter, LlavaOnevisionAdapter)
    samples = processor_samples(llava_onevision_processor(model), [
        ("w5 <image> w6 w7", 1), ("w8 w9 w10", 0), ("<image> w11 <image> w12", 2), ("w13 <image> w14", 1)],
        model.config.image_token_id, seed=4)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
    rows = [adapter.image_rows(s) for s in samples]
    assert rows[1] == [] and rows[2] == [17, 17]  # several images: base tile + one newline each
    assert rows[0][0] > 17 and rows[3][0] > 17  # alone: any-resolution tiles, unpadded, newlines
    logit_err, grad_err = _compare(model, adapter, samples, _onevision_fused)
    assert logit_err < 1e-12 and grad_err < 1e-12, (logit_err, grad_err)
    # negative control: the newline rows are image rows of the encoder stage (moving it moves them)
    stage = adapter.split()["vision"]
    vision = {k: (v.double() if v.is_floating_point() else v) for k, v in adapter.vision_inputs(samples[:1]).items()}
    with torch.no_grad():
        model.model.image_newline.add_(1.0)
        moved = stage(**vision)
        model.model.image_newline.sub_(1.0)
        assert float((moved - stage(**vision)).abs().max()) > 0.5


@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-gemma3", "tiny-internvl",
                                  "tiny-llava-onevision"])
def test_builtin_tiny_models_validate_and_plan(name, tmp_path, capsys):
    import json
    import pathlib

    from ds_hetero.cli import main

    root = pathlib.Path(__file__).resolve().parents[2]
    assert main(["validate", str(root / "ds_configs/llava_colocated.json"), "--world-size", "4", "--model", name]) == 0
    assert "valid for 4 ranks" in capsys.readouterr().out
    out = tmp_path / "planned.json"
    assert main(["plan", "--model", name, "--world-size", "4", "--seq-len", "64", "--image-tokens", "16",
                 "--global-batch", "8", "--machine", "h100", "--top", "3", "--write", str(out)]) == 0
    cfg = json.loads(out.read_text())["hetero_parallel"]["stages"]["language"]
    if name == "tiny-gemma3":  # the planner proposes only what the adapter accepts
        assert cfg.get("cp", 1) == 1 and not cfg.get("sequence_parallel", False)


def test_qwen2_5_vl_rows_of_an_image_do_not_depend_on_the_other_images_of_its_rank():
    """Windows and full-attention spans are per image: any subset of images (what an encoder rank
    holds after balancing) gives each image the rows it has in the whole batch."""
    model = tiny_qwen2_5_vl(seed=2).double()
    adapter = adapter_for(model)
    samples = qwen_samples(model, [(1, 8, 8), (1, 4, 12), (1, 8, 4)])
    stage = adapter.split()["vision"]

    def rows(subset):
        v = adapter.vision_inputs(subset)
        return stage(v["pixel_values"].double(), v["image_grid_thw"])

    whole = rows(samples).detach()
    alone = torch.cat([rows([s]).detach() for s in samples])
    assert torch.allclose(whole, alone, rtol=0, atol=1e-12)
