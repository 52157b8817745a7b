"""The planner for a model with several encoders (Qwen2.5-Omni: vision + audio + language), without
processes: the audio encoder's rows, parameters and FLOPs against hand counts and the model built
from the same config, the enumeration (each encoder its own layout; colocated, disaggregated and
mixed placements, validity from the engine's checks only), the ranking, and `ds-hetero plan
--model tiny-qwen2.5-omni --write` whose config `ds-hetero validate` accepts."""

import json

import pytest
import torch

from ds_hetero.planner.candidate import StageChoice
from ds_hetero.families.qwen2_5_omni.shapes import audio_rows
from ds_hetero.planner.model_spec import model_spec
from ds_hetero.planner.flops import vision_work
from ds_hetero.planner.workload import Workload

BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


@pytest.fixture(scope="module")
def omni():
    from ds_hetero.toy import tiny_qwen2_5_omni

    # text 64 wide; vision tower 32 x 2 blocks (Qwen2.5-VL kind); audio encoder d 32 x 2 layers,
    # 4 heads, ffn 64, 16 mel bins, n_window 4, output 64
    return tiny_qwen2_5_omni(seed=0)


@pytest.fixture(scope="module")
def spec(omni):
    return model_spec(omni.config)


def test_audio_rows_hand_count(omni):
    # F frames -> conv2 (stride 2): (F - 1) // 2 + 1 tower tokens -> pooling (stride 2): rows
    assert [audio_rows(f) for f in (13, 16, 20, 24, 100)] == [3, 4, 5, 6, 25]
    assert audio_rows(24) == ((24 - 1) // 2 + 1 - 2) // 2 + 1 == 6
    tower = omni.model.audio_tower
    for f in range(3, 200):
        _, out = tower._get_feat_extract_output_lengths(torch.tensor(f))
        assert audio_rows(f) == int(out), f
    # and the rows the adapter plans for a clip are the same (its placeholder runs)
    from ds_hetero.families import adapter_for
    from ds_hetero.testing.omni_samples import omni_samples

    sample = omni_samples(omni, [[("audio", 24), ("audio", 13)]])[0]
    assert adapter_for(omni).encoders()["audio"].rows(sample) == [6, 3]


def test_every_encoder_and_the_language_parameters_match_the_model(omni, spec):
    assert spec.names == ("vision", "audio")
    tower = omni.model.audio_tower
    bos_eos = tower.audio_bos_eos_token.weight.numel()
    assert spec.encoder("audio").params() == sum(p.numel() for p in tower.parameters()) - bos_eos == 23872
    assert spec.encoder("audio").untrained_params() == bos_eos == 2 * 64
    assert spec.encoder("vision").params() == sum(p.numel() for p in omni.model.visual.parameters())
    assert spec.language.params() == sum(p.numel() for p in omni.model.language_model.parameters()) + \
        omni.lm_head.weight.numel()
    # audio tp 2: q/k/v/out and fc1/fc2 split; convolutions, norms, row-parallel biases, proj whole
    a, d = spec.encoder("audio"), 32
    whole = (3 * 16 * d + d + 3 * d * d + d) + 2 * (4 * d + 2 * d) + (2 * d + d * 64 + 64)
    assert a.replicated_params() == whole
    assert spec.view("audio").params_per_rank("vision", 2) == (a.params() - whole) / 2 + whole


def test_audio_flops_hand_count(spec):
    # one sample with one clip of 6 rows: 12 tower tokens, attention in chunks of n_window = 4 tokens
    wl = Workload(seq_len=64, image_tokens=6, global_batch=1, dtype_bytes=4)
    n, d, f, heads, hd, rows, out, n_mel = 12, 32, 64, 4, 8, 6, 64, 16
    conv1 = 2 * n * (2 * 3 * n_mel) * d  # two frames per token, kernel 3: no gradient to the features
    conv2 = 2 * n * (3 * d) * d  # kernel 3 over d channels, stride 2: one per token, with input gradient
    chunks = n // 4
    layer = (2 * n * d * 3 * d  # q, k, v
             + 2 * n * d * d  # out
             + 2 * n * d * f + 2 * n * f * d  # fc1, fc2
             + heads * chunks * 2 * (2 * 4 * hd * 4))  # scores and p x v within each 4-token chunk
    proj = 2 * rows * d * out  # after pooling: one per row, not split over tp
    expected = 2 * conv1 + 3 * conv2 + 3 * 2 * layer + 3 * proj
    assert vision_work(spec.view("audio"), wl, samples=1, tp=1).flops == expected == 1658880


def test_enumeration_gives_each_encoder_its_own_layout_and_placement(omni):
    from ds_hetero.families import adapter_for
    from ds_hetero.planner.enumerate import SearchSpace
    from ds_hetero.planner.enumerate import enumerate_candidates
    from ds_hetero.planner.validity import check_candidate

    adapter = adapter_for(omni)
    space = SearchSpace(world_size=4, global_batch=8, max_tp=4, placements=("colocated", "disaggregated", "mixed"),
                        micro_batches=(1, 2))
    cands, stats = enumerate_candidates(space, BASE, adapter, names=("vision", "audio"))
    assert stats["generated"] == len(cands) + stats["rejected"] and stats["rejected"] > 0
    by = {}
    for c in cands:
        by.setdefault(c.placement, []).append(c)
        check_candidate(c.ds_config(BASE), 4, adapter)  # every one accepted by the engine's checks
    assert set(by) == {"colocated", "disaggregated", "mixed"}
    layouts = {(dict(c.encoders)["vision"].tp, dict(c.encoders)["audio"].tp) for c in by["colocated"]}
    assert {(1, 2), (2, 1), (1, 1), (2, 2)} <= layouts  # the encoders' tp sizes vary independently
    mixed = by["mixed"][0].section()["stages"]
    assert set(mixed) == {"vision", "audio", "language"} and all("ranks" in s for s in mixed.values())
    assert all(e.tp in (1, 2, 4) for c in cands for _, e in c.encoders)
    assert any(isinstance(e, StageChoice) and e.tp == 4 for c in cands for _, e in c.encoders)
    # the rejected ones are rejected by the engine's fields (e.g. the batch per dp rank)
    assert all(k.startswith(("hetero_parallel", "train_batch_size")) for k in stats["reasons"])


def test_ranking_and_the_homogeneous_baseline(omni):
    from ds_hetero.planner.calibrate import machine_profile
    from ds_hetero.planner.report import ranked_table
    from ds_hetero.planner.search import plan

    result = plan(omni, 4, 96, None, 8, machine_profile("cpu"), base=BASE, rows={"vision": 16, "audio": 12})
    preds = result.predictions
    assert preds and preds == sorted(preds, key=lambda p: (not p.fits, -p.tokens_per_s))
    homog = result.best_homogeneous()
    assert homog is not None and all(e.tp == homog.candidate.language.tp for _, e in homog.candidate.encoders)
    # the boundary: nothing moves when every encoder is in the language's layout (rows already in place)
    assert homog.boundary_bytes == 0
    apart = [p for p in preds if p.candidate.placement == "disaggregated"]
    assert apart and all(p.boundary_bytes > 0 for p in apart)
    table = ranked_table(result, 5)
    assert "audio" in table and "vision" in table and "baseline (every encoder in the language's layout)" in table
    with pytest.raises(ValueError, match="--rows audio=N"):
        plan(omni, 4, 96, None, 8, machine_profile("cpu"), base=BASE, rows={"vision": 16})
    with pytest.raises(ValueError, match="exceed --seq-len"):
        plan(omni, 4, 16, None, 8, machine_profile("cpu"), base=BASE, rows={"vision": 16, "audio": 12})


def test_plan_write_then_validate(tmp_path, capsys):
    from ds_hetero.cli import main

    out = tmp_path / "omni.json"
    rc = main(["plan", "--model", "tiny-qwen2.5-omni", "--world-size", "4", "--seq-len", "96", "--image-tokens",
               "16", "--rows", "audio=12", "--global-batch", "8", "--top", "3", "--write", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "audio" in text and f"wrote {out}" in text
    cfg = json.loads(out.read_text())
    assert set(cfg["hetero_parallel"]["stages"]) == {"vision", "audio", "language"}
    assert main(["validate", str(out), "--world-size", "4", "--model", "tiny-qwen2.5-omni"]) == 0
    # a vision-only model refuses --rows; an omni model needs every encoder's rows
    assert main(["plan", "--model", "tiny-qwen2-vl", "--world-size", "4", "--seq-len", "96", "--image-tokens", "16",
                 "--rows", "audio=4", "--global-batch", "8"]) == 1
    assert main(["plan", "--model", "tiny-qwen2.5-omni", "--world-size", "4", "--seq-len", "96", "--image-tokens",
                 "16", "--global-batch", "8"]) == 1
    assert "--rows audio=N" in capsys.readouterr().err


def test_single_encoder_models_keep_their_spec():
    from ds_hetero.planner.model_source import load_hf_config

    assert model_spec(load_hf_config("tiny-qwen2-vl")).names == ("vision",)  # one encoder


def test_auto_options_for_several_encoders():
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.planner.auto import auto_options

    opts = auto_options({"auto": True, "rows": {"audio": 12}, "placement": "mixed"})
    assert opts["rows"] == {"audio": 12} and opts["placement"] == "mixed"
    with pytest.raises(HeteroConfigError, match=r"hetero_parallel\.rows"):
        auto_options({"auto": True, "rows": {"audio": -1}})
    with pytest.raises(HeteroConfigError, match=r"hetero_parallel\.rows"):
        auto_options({"auto": True, "rows": [12]})
