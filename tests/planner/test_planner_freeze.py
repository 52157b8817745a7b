"""The planner prices the base config's `freeze` (planner/frozen.py), against hand counts, no processes:
a frozen tower's state bytes, a frozen stage's backward FLOPs, the dp reduction bytes, the boundary's
backward; the freeze resolved from the config as the engine resolves it; `ds-hetero plan` with a
frozen tower predicting less memory and time, its `--write` keeping the freeze and passing validate.
Each check compares with the same count unfrozen (the negative control)."""

import json
from dataclasses import replace

import pytest

from ds_hetero.planner.candidate import Candidate, StageChoice
from ds_hetero.planner.collectives import language_collectives, vision_collectives
from ds_hetero.planner.flops import language_work, vision_work
from ds_hetero.planner.frozen import Freeze, StageFreeze, carry_freeze, kept_section, resolve_freeze
from ds_hetero.planner.machine import PROFILES
from ds_hetero.planner.memory import state_elements, vision_memory
from ds_hetero.planner.model_spec import model_spec
from ds_hetero.planner.workload import Workload

OPT = {"type": "AdamW", "params": {"lr": 1e-4}}
TOWER = Freeze((("vision", StageFreeze(tower=True)),))
VISION = Freeze((("vision", StageFreeze(trains=False)),))
LANGUAGE = Freeze((("language", StageFreeze(trains=False)),))


@pytest.fixture(scope="module")
def llava():
    from ds_hetero.toy import tiny_llava

    return tiny_llava()  # text 64 x 2 layers; CLIP 32 x 2 (feature layer -2: 1 layer trained), 32px/8: 16 rows


@pytest.fixture(scope="module")
def spec(llava):
    return model_spec(llava.config)


def _wl(freeze=Freeze(), zero=1):
    return Workload(seq_len=96, image_tokens=16, global_batch=8, dtype_bytes=2, zero=zero, freeze=freeze)


def _projector(spec):
    (i1, o1), (i2, o2) = spec.vision.projector  # LLaVA: linear_1, GELU, linear_2 (with biases)
    return i1 * o1 + o1 + i2 * o2 + o2


def test_frozen_tower_state_bytes_hand_count(spec):
    p, pj = spec.params_per_rank("vision", 1), _projector(spec)
    assert spec.vision.projector_params_per_rank(1) == pj
    tail = spec.vision.untrained_params() * 2
    cand = Candidate("colocated", StageChoice(1, 2), StageChoice(1, 2), 1)
    # ZeRO 1, dp 2: the projector trains (bf16 parameter and gradient, fp32 master and two moments over
    # dp); the tower is held once in bf16, no gradient, no optimizer state
    trained = pj * 2 + pj * 2 + (pj / 2 + 2 * pj / 2) * 4
    assert vision_memory(spec, _wl(TOWER), cand, True, 1).states == trained + (p - pj) * 2 + tail
    unfrozen = vision_memory(spec, _wl(), cand, True, 1).states
    assert unfrozen == p * 2 + p * 2 + (p / 2 + p) * 4 + tail > trained + (p - pj) * 2 + tail
    # ZeRO 3 partitions every parameter of the module, the frozen ones too (DeepSpeed's parameter_offload)
    z3 = vision_memory(spec, _wl(TOWER, zero=3), cand, True, 1).states
    assert z3 == (pj / 2) * 2 + (pj / 2) * 2 + (pj / 2 + pj) * 4 + (p - pj) / 2 * 2 + tail
    # a stage that does not train runs ZeRO 0 without optimizer: its parameters whole, in bf16, nothing else
    assert vision_memory(spec, _wl(VISION, zero=3), cand, True, 1).states == p * 2 + tail
    # tp 2: the tower's share is what the projector's split leaves
    tp2 = spec.vision.projector_params_per_rank(2)
    (i1, o1), (i2, o2) = spec.vision.projector
    assert tp2 == (i1 * o1 + o1 + i2 * o2) / 2 + o2  # linear_2's bias is replicated (added after the reduction)


def test_frozen_tower_keeps_only_the_projector_activations(spec):
    cand = Candidate("colocated", StageChoice(1, 2), StageChoice(1, 2), 1)
    rows = 4 * 16  # 4 samples per dp rank, one 16-row image each
    (i1, o1), _ = spec.vision.projector
    out = rows * spec.language.hidden * 2
    # linear_1's input, GELU's input and output, the output rows (measured: 57344 B on the tiny LLaVA in fp32)
    assert vision_memory(spec, _wl(TOWER), cand, True, 1).activations == rows * (i1 + 2 * o1) * 2 + out
    assert vision_memory(spec, _wl(VISION), cand, True, 1).activations == out  # forward without autograd
    assert vision_memory(spec, _wl(), cand, True, 1).activations > rows * (i1 + 2 * o1) * 2 + out


def test_frozen_backward_flops_hand_count(spec):
    rows = 4 * 16
    (i1, o1), (i2, o2) = spec.vision.projector
    # a frozen tower: no backward there; linear_1 its weight gradient only, linear_2 both gradients
    assert vision_work(spec, _wl(TOWER), 4, 1).backward_flops == 2 * rows * i1 * o1 + 2 * 2 * rows * o1 * o2
    assert vision_work(spec, _wl(VISION), 4, 1).backward_flops == 0
    full = vision_work(spec, _wl(), 4, 1)
    assert full.backward_flops > 3 * vision_work(spec, _wl(TOWER), 4, 1).backward_flops  # control: the tower's
    assert vision_work(spec, _wl(TOWER), 4, 1).forward_flops == full.forward_flops  # the forward is unchanged
    # a frozen language stage carries the encoder's gradient: one GEMM per linear, attention's two products
    # both (input gradients of q, k, v); its forward unchanged
    lm = spec.language
    tokens, s = 4 * 96, 96
    attn = 2 * 4 * lm.heads * (s * lm.head_dim * s) * 2 * lm.layers  # scores + p x v, full matrix (causal 1.0)
    trained, frozen = language_work(spec, _wl(), 4, 1, 1, 1.0), language_work(spec, _wl(LANGUAGE), 4, 1, 1, 1.0)
    assert frozen.forward_flops == trained.forward_flops
    linear = trained.forward_flops - attn
    assert trained.backward_flops == 2 * trained.forward_flops
    assert frozen.backward_flops == linear + 2 * attn
    assert tokens * lm.hidden * lm.vocab * 2 < linear  # the head is among the linears


def test_dp_reduction_bytes_of_frozen_parameters(spec):
    layout = StageChoice(1, 2)
    p, pj = spec.params_per_rank("vision", 1), _projector(spec)

    def dp(wl, stage="vision"):
        colls = (vision_collectives(spec, wl, 4, layout) if stage == "vision"
                 else language_collectives(spec, wl, 4, layout))
        return [(c.kind, c.nbytes, c.count) for c in colls if c.axis == "dp"]

    # ZeRO 1: the trained projector's gradients reduce-scattered, its updated partition gathered
    assert dp(_wl(TOWER)) == [("reduce_scatter", pj * 2, 1), ("all_gather", pj * 2, 1)]
    assert dp(_wl()) == [("reduce_scatter", p * 2, 1), ("all_gather", p * 2, 1)]  # control
    # ZeRO 3: every parameter gathered in the forward, the projector's alone in the backward
    assert dp(_wl(TOWER, zero=3)) == [("reduce_scatter", pj * 2, 1), ("all_gather", p * 2, 1),
                                     ("all_gather", pj * 2, 1)]
    # a stage that does not train: ZeRO 0 without optimizer, no dp collective
    assert dp(_wl(VISION, zero=3)) == [] and dp(_wl(LANGUAGE), "language") == []
    assert dp(_wl(), "language")  # control


def test_stage_times_and_boundary_of_a_frozen_encoder(spec):
    from ds_hetero.planner.cost import stage_times
    from ds_hetero.planner.step_model import boundary_seconds

    m = PROFILES["h100"]
    layout = StageChoice(1, 2)
    t, part = stage_times(spec, _wl(VISION), m, "vision", layout, 1)
    assert t.backward == 0 and t.step == 0 and part["optimizer"] == 0 and part["dp"] == 0
    t_tower, part_tower = stage_times(spec, _wl(TOWER), m, "vision", layout, 1)
    t_full, part_full = stage_times(spec, _wl(), m, "vision", layout, 1)
    assert 0 < t_tower.backward < t_full.backward / 5 and 0 < part_tower["optimizer"] < part_full["optimizer"]
    assert t_tower.forward == pytest.approx(t_full.forward)
    cand = Candidate("disaggregated", StageChoice(1, 2, ranks=(0, 1)), StageChoice(1, 2, ranks=(2, 3)), 1)
    _, both = boundary_seconds(cand, spec, _wl(), m)
    _, forward = boundary_seconds(cand, spec, _wl(VISION), m)
    assert forward == both / 2 > 0  # no row gradients back to an encoder that does not train
    assert boundary_seconds(cand, spec, _wl(TOWER), m)[1] == both  # the projector still takes them


def test_freeze_resolved_from_the_config_as_the_engine_resolves_it(llava):
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.families import adapter_for

    adapter = adapter_for(llava)

    def resolve(vision=None, language=None):
        stages = {n: {"freeze": v} for n, v in (("vision", vision), ("language", language)) if v is not None}
        return resolve_freeze({"stages": stages}, adapter)

    assert resolve(["tower"]).of("vision") == StageFreeze(tower=True)
    assert resolve(["projector"]).of("vision") == StageFreeze(projector=True)
    assert resolve(True).of("vision") == resolve(["tower", "projector"]).of("vision") == StageFreeze(trains=False)
    assert resolve(language=True).of("language") == StageFreeze(trains=False)
    assert resolve().of("vision") == StageFreeze()  # control: nothing frozen
    layer = resolve(["model.vision_tower.encoder.layers.0.*"]).of("vision")
    assert not layer.tower and 0 < layer.share < 1  # a pattern: its share of the trained parameters
    with pytest.raises(HeteroConfigError, match="freeze"):
        resolve(["no.such.parameter"])
    # the base config keeps the freeze alone; every candidate's section carries it
    kept = kept_section({"placement": "colocated", "stages": {"vision": {"tp": 1, "dp": 4, "freeze": ["tower"]},
                                                              "language": {"tp": 2, "dp": 2}}})
    assert kept == {"stages": {"vision": {"freeze": ["tower"]}}}
    section = {"stages": {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 1, "dp": 4}}}
    assert carry_freeze(section, {"hetero_parallel": kept})["stages"]["vision"] == {"tp": 2, "dp": 2,
                                                                                    "freeze": ["tower"]}
    assert kept_section({"stages": {"vision": {"tp": 1, "dp": 4}}}) is None


def test_plan_with_a_frozen_tower_predicts_less_and_writes_the_freeze(tmp_path, capsys):
    from ds_hetero.cli import main

    base = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "optimizer": OPT}
    frozen = dict(base, hetero_parallel={"stages": {"vision": {"tp": 1, "dp": 4, "freeze": ["tower"]},
                                                    "language": {"tp": 1, "dp": 4}}})
    paths = {}
    for name, cfg in (("trained", base), ("frozen", frozen)):
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
        paths[name] = tmp_path / f"{name}_out.json"
        assert main(["plan", "--model", "tiny-llava", "--world-size", "4", "--seq-len", "96", "--image-tokens", "16",
                     "--global-batch", "8", "--machine", "h100", "--placement", "disaggregated", "--no-modelled",
                     "--top", "1", "--breakdown", "1", "--config", str(tmp_path / f"{name}.json"),
                     "--write", str(paths[name])]) == 0
    text = capsys.readouterr().out
    assert "vision frozen: tower (the config's freeze, in every row)" in text and "vision (frozen: tower)" in text
    written = json.loads(paths["frozen"].read_text())
    assert written["hetero_parallel"]["stages"]["vision"]["freeze"] == ["tower"]
    assert "freeze" not in json.loads(paths["trained"].read_text())["hetero_parallel"]["stages"]["vision"]
    assert main(["validate", str(paths["frozen"]), "--world-size", "4", "--model", "tiny-llava"]) == 0
    assert "frozen: tower" in capsys.readouterr().out


def test_plan_api_frozen_tower_lowers_encoder_memory_and_step_time():
    from ds_hetero.planner import machine_profile, plan

    base = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "optimizer": OPT}
    frozen = dict(base, hetero_parallel={"stages": {"vision": {"freeze": ["tower"]}}})
    kw = dict(placements=("disaggregated",), modelled=False)
    plans = [plan("tiny-llava", 4, 96, 16, 8, machine_profile("h100"), base=b, **kw) for b in (base, frozen)]
    by_label = [{p.candidate.label(): p for p in pl.predictions} for pl in plans]
    shared = sorted(set(by_label[0]) & set(by_label[1]))
    assert shared
    for label in shared:
        trained, frozen_pred = by_label[0][label], by_label[1][label]
        assert frozen_pred.peak_memory["vision"] < trained.peak_memory["vision"]
        assert frozen_pred.peak_memory["language"] == trained.peak_memory["language"]
        assert frozen_pred.step_s < trained.step_s
        assert plans[1].ds_config(frozen_pred)["hetero_parallel"]["stages"]["vision"]["freeze"] == ["tower"]
    assert replace(plans[1].workload, freeze=Freeze()) == plans[0].workload  # the only difference
