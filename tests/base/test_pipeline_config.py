"""The language stage's pipeline axis without processes: rank order, groups, the layer cut,
config parsing and every rejection (the same HeteroConfigError from validate and initialize),
and the chunks of a decoder composing to the whole language stage."""

import copy

import pytest
import torch

from ds_hetero.cli import rank_map
from ds_hetero.config import load_config
from ds_hetero.pipeline_parallel.cut import layer_cut
from ds_hetero.errors import HeteroConfigError
from ds_hetero.validation import check_all
from ds_hetero.layout import Coord, StageLayout


def ds(stages, batch=16, **section):
    return {"train_batch_size": batch, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "hetero_parallel": {"micro_batches": 4, "stages": stages, **section}}


def test_pp_is_outermost_and_groups_stay_inside_a_pipeline_stage():
    layout = StageLayout("language", tp=2, cp=1, dp=2, pp=2, ranks=tuple(range(8)))
    assert layout.coord(0) == Coord(0, 0, 0, 0) and layout.coord(3) == Coord(1, 0, 1, 0)
    assert layout.coord(4) == Coord(0, 0, 0, 1) and layout.coord(7) == Coord(1, 0, 1, 1)
    assert layout.rank_at(tp=1, dp=1, pp=1) == 7
    assert layout.tp_groups() == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.dp_groups() == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.pp_groups() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert layout.model_parallel_groups() == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.chunk(0) == StageLayout("language", 2, 1, 2, (0, 1, 2, 3))
    assert layout.chunk(1).ranks == (4, 5, 6, 7) and layout.shape == "tp2cp1dp2pp2"
    assert StageLayout("v", 1, 1, 4, (0, 1, 2, 3)).pp_groups() == []  # no pipeline: no group of one rank


def test_layer_cut_even_uneven_and_rejections():
    assert layer_cut(4, 2) == (range(0, 2), range(2, 4))
    assert layer_cut(4, 3) == (range(0, 2), range(2, 3), range(3, 4))
    assert layer_cut(4, 2, (1, 3)) == (range(0, 1), range(1, 4))
    with pytest.raises(HeteroConfigError, match="pp_layers.*sums to 5"):
        layer_cut(4, 2, (2, 3))
    with pytest.raises(HeteroConfigError, match=r"stages.language.pp'.*4 decoder layers"):
        layer_cut(4, 5)


def test_config_pipeline_placements():
    cfg = load_config(ds({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [1, 3]}}), 4)
    assert cfg.language.pp == 2 and cfg.pp_layers == (1, 3) and cfg.language.ranks == (0, 1, 2, 3)
    lang = cfg.stage_ds_config("language")  # each pipeline stage's engine: its dp, all micro-batches
    assert (lang["train_micro_batch_size_per_gpu"], lang["gradient_accumulation_steps"]) == (2, 4)
    first = load_config(ds({"vision": {"tp": 2, "dp": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}},
                           placement="first_stage"), 4)
    assert first.stages["vision"].ranks == (0, 1) and first.language.ranks == (0, 1, 2, 3)
    dis = load_config(ds({"vision": {"dp": 1}, "language": {"dp": 1, "pp": 3}}, placement="disaggregated"), 4)
    assert dis.stages["vision"].ranks == (0,) and dis.language.ranks == (1, 2, 3)
    text = rank_map(first)
    assert "language (tp,cp,dp,pp)" in text and "tp2 cp1 dp1 pp2" in text
    assert [line.split()[-1] for line in text.splitlines()[-4:]] == ["0,0,0,0", "1,0,0,0", "0,0,0,1", "1,0,0,1"]


@pytest.mark.parametrize("stages,section,field,match", [
    ({"vision": {"dp": 2, "pp": 2}, "language": {"dp": 4}}, {}, "stages.vision.pp", "only the language stage"),
    ({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [4]}}, {}, "pp_layers", "lists 1 chunks"),
    ({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [0, 4]}}, {}, "pp_layers", "positive"),
    ({"vision": {"dp": 4}, "language": {"dp": 4, "pp": 2}}, {}, "stages.language", "x pp = 1 x 1 x 4 x 2 = 8"),
    ({"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, {"placement": "first_stage"}, "stages.vision",
     "first pipeline stage"),
    ({"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 2, "pp": 2}}, {"placement": "first_stage"},
     "stages.vision.ranks", "remove the key"),
    ({"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 1, "pp": 2, "ranks": [2, 3]}},
     {"placement": "disaggregated", "zero3": True}, "zero_optimization.stage", "placement 'disaggregated'"),
    ({"vision": {"tp": 2, "dp": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}},
     {"placement": "first_stage", "zero3": True}, "zero_optimization.stage", "encoder in placement \"first_stage\""),
])
def test_rejections_name_the_field(stages, section, field, match):
    zero3 = section.pop("zero3", False)
    config = ds(stages, **section)
    if zero3:
        config["zero_optimization"] = {"stage": 3}
    with pytest.raises(HeteroConfigError, match=match) as info:
        check_all(load_config(config, 4))
    assert field in str(info.value)


def test_model_checks_layers_and_tied_embeddings():
    from ds_hetero.toy import tiny_llava

    model = tiny_llava(text_layers=2)
    with pytest.raises(HeteroConfigError, match="2 decoder layers"):
        check_all(load_config(ds({"vision": {"dp": 4}, "language": {"dp": 1, "pp": 4}}), 4), model)
    model.lm_head.weight = model.get_input_embeddings().weight  # tie them: accepted (tests/pipeline/test_tied_pipeline.py)
    check_all(load_config(ds({"vision": {"dp": 2}, "language": {"dp": 1, "pp": 2}}), 2), model)


@pytest.mark.parametrize("family,pp_layers", [("llava", (1, 3)), ("llava", (2, 1, 1)), ("qwen2_vl", (2, 2))])
def test_chunks_compose_to_the_language_stage(family, pp_layers):
    """Running the chunks one after the other gives the pp-1 language stage's logits and gradients."""
    from ds_hetero.families import adapter_for
    from ds_hetero.pipeline_parallel.chunk import PipelineChunk
    from ds_hetero.testing.parity import build_model, make_batches

    model = build_model(family, seed=3, text_layers=4)
    adapter = adapter_for(model)
    samples = make_batches(family, model, 1, 4)[0]
    batch = adapter.language_inputs(samples)
    n_rows = int((batch["input_ids"] == adapter.image_token_id).sum())
    rows = torch.randn(n_rows, adapter.hidden_size, requires_grad=True)
    whole = adapter.split()["language"]
    args = (batch["attention_mask"], batch["position_ids"])
    want = whole(batch["input_ids"], (rows,), *args)
    cut = layer_cut(4, len(pp_layers), pp_layers)
    x = batch["input_ids"]
    params = []
    for k in range(len(pp_layers)):
        chunk = PipelineChunk(whole, k, len(pp_layers), cut[k])
        params.append(list(chunk.parameters()))
        x = chunk(x, (rows,) if k == 0 else (), *args)
    torch.testing.assert_close(x, want, rtol=1e-6, atol=1e-6)
    # every parameter of the language stage is in exactly one chunk
    ids = [id(p) for ps in params for p in ps]
    assert len(ids) == len(set(ids)) == len(list(whole.parameters()))
    g = torch.randn_like(want)
    got = torch.autograd.grad(x, [rows], g)[0]
    assert torch.allclose(got, torch.autograd.grad(want, [rows], g)[0], rtol=1e-5, atol=1e-6)
    # a first chunk whose end is off by one layer (it also runs the next chunk's first layer)
    # does not compose to the same function: the check can fail
    wrong = [range(0, cut[0].stop + 1)] + list(cut[1:])
    y = batch["input_ids"]
    for k in range(len(pp_layers)):
        y = PipelineChunk(whole, k, len(pp_layers), wrong[k])(y, (rows,) if k == 0 else (), *args)
    assert not torch.allclose(y, want, rtol=1e-3, atol=1e-3)


def test_pipeline_overlap_per_rank():
    """Encoder time inside the window from the first language forward to the last language backward."""
    from ds_hetero.timeline import Span, pipeline_overlap

    rank0 = [Span("vision.forward[m=0]", "forward", 0.0, 1.0, 3), Span("language.forward[m=0]", "forward", 1.0, 2.0, 3),
             Span("vision.backward[m=0]", "backward", 2.5, 4.0, 3), Span("language.forward[m=0]", "forward", 0, 9, 2)]
    rank1 = [Span("pipeline.recv_activation[m=0]", "pipeline", 0.0, 2.0, 3),
             Span("language.backward[m=0]", "backward", 2.0, 3.0, 3)]
    got = pipeline_overlap([rank0, rank1], step=3)
    assert got[0] == {"encoder_s": 2.5, "language_s": 1.0, "pipeline_wait_s": 0.0, "encoder_in_pipeline_s": 0.5}
    assert got[1] == {"encoder_s": 0.0, "language_s": 1.0, "pipeline_wait_s": 2.0, "encoder_in_pipeline_s": 0.0}
