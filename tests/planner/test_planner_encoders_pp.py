"""The multi-encoder planner with a pipelined language stage, first_stage, fewer encoder passes,
recompute and per-stage ZeRO, without processes: the pipeline terms for several encoders by hand
(the step with each encoder's passes in the pipeline's idle time, the bubble, the encoder passes a
rank holds at once per encoder, the language's in-flight micro-batches), the search (every
placement with pp rows, the Megatron baseline, features only where the lighter layout does not
fit, every row accepted by the engine's checks) and `ds-hetero plan --pp 2 --write` whose config
`ds-hetero validate` accepts (tests/planner/test_planner_encoders_run.py trains it)."""

import json

import pytest

from ds_hetero.planner.candidate import StageChoice
from ds_hetero.planner.step_time import StageTimes, colocated_encoders_step, colocated_pipeline_step, colocated_step

BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
ROWS = {"vision": 16, "audio": 12}
CHUNKS = [StageTimes(1.0, 2.0, 0.5), StageTimes(2.0, 3.0, 0.7)]  # 3 s and 5 s per micro-batch
A = StageTimes(0.5, 1.5, 0.2)  # an encoder: 2 s per pass
B = StageTimes(0.25, 0.75, 0.1)  # another: 1 s per pass


def test_several_encoders_in_the_pipelines_idle_time_hand_count():
    # 1F1B of 4 micro-batches over 3 s and 5 s stages: 3 x 5 + (3 + 5) = 23 s, the slowest stage
    # busy 20 s of it: 3 s of fill and drain. Each encoder's first forward and last backward lie
    # outside (2 + 1 s); the other passes go into the idle time.
    # A 2 passes, B 4: 1 x 2 + 3 x 1 = 5 s > 3 s idle, so the pipeline stretches to 20 + 5
    step, busy = colocated_encoders_step([(A, 2, 0.1), (B, 4, 0.2)], CHUNKS, 4)
    exchanges, steps = 2 * 0.1 + 4 * 0.2, 0.2 + 0.1 + 0.7
    assert step == pytest.approx(3 + 25 + exchanges + steps) == pytest.approx(30.0)
    assert busy == pytest.approx(2 * 2 + 4 * 1 + 4 * 5 + steps) == pytest.approx(29.0)
    # A 1 pass, B 2: 1 s of passes fits in the 3 s idle: the 23 s pipeline is not stretched
    step, busy = colocated_encoders_step([(A, 1, 0.1), (B, 2, 0.2)], CHUNKS, 4)
    assert step == pytest.approx(3 + 23 + (0.1 + 0.4) + steps) == pytest.approx(27.5)
    assert busy == pytest.approx(2 + 2 + 20 + steps) == pytest.approx(25.0)
    # the bubble: 3 s of fill and drain less the 1 s of passes moved into it, plus 0.5 s of exchanges
    assert 1 - busy / step == pytest.approx(2.5 / 27.5)


def test_several_encoders_reduce_to_the_single_encoder_formulas():
    # one encoder: exactly the single-encoder pipeline step (the vision-only planner is unchanged)
    for chunks in (CHUNKS, CHUNKS[:1]):
        for passes in (1, 2, 4):
            assert colocated_encoders_step([(A, passes, 0.3)], chunks, 4) == \
                colocated_pipeline_step(A, chunks, 0.3, 4, passes)
    # no pipeline, every encoder once per micro-batch: one after the other, as colocated_step
    summed = StageTimes(A.forward + B.forward, A.backward + B.backward, A.step + B.step)
    got = colocated_encoders_step([(A, 4, 0.1), (B, 4, 0.2)], CHUNKS[:1], 4)
    assert got == pytest.approx(colocated_step(summed, CHUNKS[0], 0.3, 4))
    # hand: 4 x (2 + 1 + 3) + 4 x 0.3 + 0.3 + 0.5
    assert got[0] == pytest.approx(24 + 1.2 + 0.8)


@pytest.fixture(scope="module")
def omni():
    from ds_hetero.toy import tiny_qwen2_5_omni

    return tiny_qwen2_5_omni(seed=0)


def _cand(placement, vision, audio, language, m, passes=()):
    from ds_hetero.planner.candidate import Candidate

    return Candidate(placement, (("vision", vision), ("audio", audio)), language, m, passes)


def test_encoder_passes_held_per_encoder_hand_count():
    from ds_hetero.planner.memory import encoder_in_flight

    lang = StageChoice(1, 2, pp=2)
    # colocated, pp 2, 4 micro-batches: stage 0 holds 2 of them (1F1B: F0 F1 B0 F2 ...); at F2,
    # micro-batch 1 is still held, so with vision 2 passes (micro-batches 0-1, 2-3) both are held;
    # audio in 1 pass holds that one; audio in 4 passes holds the 2 feeding the 2 micro-batches
    c = _cand("colocated", StageChoice(1, 4), StageChoice(2, 2), lang, 4, (("vision", 2), ("audio", 1)))
    assert [encoder_in_flight(c.view(n)) for n in ("vision", "audio")] == [2, 1]
    c = _cand("colocated", StageChoice(1, 4), StageChoice(2, 2), lang, 4, (("vision", 2),))
    assert [encoder_in_flight(c.view(n)) for n in ("vision", "audio")] == [2, 2]
    # no pipeline: one pass at a time whatever it feeds
    c = _cand("colocated", StageChoice(1, 4), StageChoice(2, 2), StageChoice(1, 4), 4, (("vision", 2),))
    assert [encoder_in_flight(c.view(n)) for n in ("vision", "audio")] == [1, 1]
    # apart: one stage ahead of the 2-stage pipeline, 3 in flight; first_stage: inside stage 0, 2
    c = _cand("disaggregated", StageChoice(1, 1, ranks=(2,)), StageChoice(1, 1, ranks=(3,)),
              StageChoice(1, 1, ranks=(0, 1), pp=2), 4)
    assert [encoder_in_flight(c.view(n)) for n in ("vision", "audio")] == [3, 3]
    c = _cand("first_stage", StageChoice(1, 2), StageChoice(1, 2), lang, 4)
    assert [encoder_in_flight(c.view(n)) for n in ("vision", "audio")] == [2, 2]


def test_memory_per_rank_holds_each_encoders_passes_and_the_pipelines_micro_batches(omni):
    from ds_hetero.planner.activations import vision_activation_bytes
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.memory import language_memory, vision_memory
    from ds_hetero.planner.memory import peak_memory, rank_peak
    from ds_hetero.planner.workload import Workload

    spec = model_spec(omni.config)
    wl = Workload(seq_len=96, image_tokens=28, global_batch=8, dtype_bytes=4, rows=tuple(ROWS.items()))
    wls = {n: wl.of(n) for n in spec.names}
    lang = StageChoice(1, 2, pp=2)
    c = _cand("colocated", StageChoice(1, 4), StageChoice(2, 2), lang, 4, (("vision", 2), ("audio", 1)))
    got = peak_memory(spec, wl, c, True)["all"]
    # vision: 2 passes held (hand count above), audio 1; stage 0 holds 2 micro-batches, stage 1 one
    vision = vision_memory(spec.view("vision"), wls["vision"], c.view("vision"), True, 2)
    audio = vision_memory(spec.view("audio"), wls["audio"], c.view("audio"), True, 1)
    stages = [language_memory(spec.view("vision"), wl, c.view("vision"), True, s, n) for s, n in ((0, 2), (1, 1))]
    # every stage's states, plus all activations (the backward) or the largest optimizer transient
    assert got == pytest.approx(max(rank_peak([vision, audio, s]) for s in stages))
    # one pass held across the language micro-batches it feeds: 1 audio pass of 4 micro-batches
    # holds 4 samples' activations per rank (dp 2), 4 passes one sample each; pp 1 holds one pass
    flat = StageChoice(1, 4)
    one = _cand("colocated", StageChoice(1, 4), StageChoice(1, 2), flat, 4, (("audio", 1),))
    four = _cand("colocated", StageChoice(1, 4), StageChoice(1, 2), flat, 4)
    per_sample = vision_activation_bytes(spec.view("audio"), wls["audio"], 1, 1, True)
    diff = peak_memory(spec, wl, one, True)["all"] - peak_memory(spec, wl, four, True)["all"]
    assert per_sample > 0 and diff == pytest.approx(3 * per_sample)
    # a plan's cache: the same layout of two encoders is two encoders' memory, not one remembered
    same = _cand("colocated", StageChoice(1, 4), StageChoice(1, 4), flat, 4)
    cache = {}
    assert [peak_memory(spec, wl, same, True, cache)["all"] for _ in range(2)] == \
        [peak_memory(spec, wl, same, True)["all"]] * 2


def test_first_stage_cuts():
    from ds_hetero.planner.modelled import first_stage_cuts

    assert list(first_stage_cuts(5, 2)) == [(1, 4), (2, 3)]
    assert list(first_stage_cuts(8, 3)) == [(1, 4, 3), (2, 3, 3)]
    assert list(first_stage_cuts(4, 1)) == []


@pytest.fixture(scope="module")
def plans(omni):
    from ds_hetero.planner.calibrate import machine_profile
    from ds_hetero.planner.search import plan

    cpu = machine_profile("cpu")
    return (plan(omni, 4, 96, None, 8, cpu, base=BASE, rows=ROWS),
            plan(omni, 4, 96, None, 8, cpu, base=BASE, memory_gb=0.0065, rows=ROWS))


def test_search_covers_pipelines_first_stage_passes_and_features(omni, plans):
    from ds_hetero.families import adapter_for
    from ds_hetero.planner.dominance import lighter_siblings
    from ds_hetero.planner.validity import check_candidate

    roomy, tight = plans
    adapter = adapter_for(omni)
    pp = {p.candidate.placement for p in roomy.predictions if p.candidate.language.pp == 2}
    assert pp == {"colocated", "disaggregated", "mixed", "first_stage"}
    for p in roomy.predictions[::40] + [p for p in roomy.predictions if p.candidate.modelled_features][::25]:
        check_candidate(p.candidate.ds_config(BASE), 4, adapter)  # every row: accepted by the engine's checks
    fewer = [p.candidate for p in roomy.predictions if p.candidate.encoder_passes]
    assert fewer and {c.placement for c in fewer} == {"colocated"}  # the others pair passes one for one
    assert any(c.language.pp == 2 for c in fewer) and any(c.language.pp == 1 for c in fewer)
    # the Megatron baseline: every encoder at the language's tp and dp, on its first pipeline stage
    meg = roomy.best_megatron()
    assert meg is not None and all((e.tp, e.dp) == (meg.candidate.language.tp, meg.candidate.language.dp)
                                   for _, e in meg.candidate.encoders)
    assert all("ranks" not in s for s in meg.candidate.section()["stages"].values())
    # everything fits: no recompute / per-stage ZeRO row is priced (a lighter sibling fits and runs)
    assert roomy.stats["pruned"] > 0
    assert not any(s.recompute or s.zero is not None for p in roomy.predictions
                   for s in [e for _, e in p.candidate.encoders] + [p.candidate.language])
    # tight memory: recompute and the language's ZeRO 3 appear, each only where its sibling does not fit
    heavy = [p for p in tight.predictions if any(s.recompute or s.zero is not None for s in
                                                 [e for _, e in p.candidate.encoders] + [p.candidate.language])]
    assert any(p.candidate.language.recompute for p in heavy) and any(p.candidate.language.zero == 3 for p in heavy)
    assert any(s.recompute for p in heavy for _, s in p.candidate.encoders)
    fitting = {p.candidate for p in tight.predictions if p.fits}
    assert all(not (set(lighter_siblings(p.candidate)) & fitting) for p in heavy)
    assert tight.best.fits and tight.best.tokens_per_s < roomy.best.tokens_per_s


def test_plan_pp_write_then_validate(tmp_path, capsys, plans):
    from ds_hetero.cli import main

    out = tmp_path / "omni_pp.json"
    rc = main(["plan", "--model", "tiny-qwen2.5-omni", "--world-size", "4", "--seq-len", "96", "--image-tokens",
               "16", "--rows", "audio=12", "--global-batch", "8", "--top", "4", "--pp", "2", "--write", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "pp2" in text and "Megatron baseline, tuned" in text
    rows = [line for line in text.splitlines()
            if line[:3].strip().isdigit() and line.split()[1] in ("colocated", "disaggregated", "mixed", "first_stage")]
    assert len(rows) == 4 and all("pp2" in line for line in rows)
    cfg = json.loads(out.read_text())
    # what the distributed test trains: the best pp 2 candidate of the same plan
    best_pp = next(p for p in plans[0].predictions if p.candidate.language.pp == 2)
    assert cfg == plans[0].ds_config(best_pp)
    assert cfg["hetero_parallel"]["stages"]["language"]["pp"] == 2
    assert main(["validate", str(out), "--world-size", "4", "--model", "tiny-qwen2.5-omni"]) == 0
