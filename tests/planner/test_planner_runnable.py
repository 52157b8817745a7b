"""The planner's pipeline, first_stage, recompute and per-stage ZeRO rows: runnable exactly when the
engine's own checks accept their config, modelled otherwise; dominance pruning changes no pick; a
pp pick and a first_stage pick pass `ds-hetero validate` and train for a few steps on 2 ranks.
"""

import json

import pytest

from ds_hetero.config import parse_config
from ds_hetero.errors import HeteroConfigError


def _plan(world=4, **kw):
    from ds_hetero.planner import machine_profile, plan

    kw.setdefault("placements", ("colocated", "disaggregated"))
    return plan("tiny-llava", world, 96, 16, 16, machine_profile("cpu"), **kw)


def _engine_accepts(cfg, world, model) -> bool:
    """The engine's checks, called directly (as initialize does), not through the planner."""
    from ds_hetero.validation import check_all

    try:
        check_all(parse_config(cfg, world), model)
        return True
    except HeteroConfigError:
        return False


def test_extended_rows_are_runnable_exactly_when_the_engine_accepts_them():
    from ds_hetero.planner.model_source import load_hf_config, meta_model

    p = _plan()
    model = meta_model(load_hf_config("tiny-llava"))
    extended = [x for x in p.predictions if x.candidate.modelled_features]
    assert len(extended) > 100
    for x in extended:
        assert x.runnable == _engine_accepts(p.ds_config(x), 4, model), x.candidate.label()
    runnable = [x.candidate for x in extended if x.runnable]
    assert any(c.language.pp > 1 and c.placement == "colocated" for c in runnable)
    assert any(c.language.pp > 1 and c.megatron for c in runnable)
    assert any(c.language.pp > 1 and c.disaggregated for c in runnable)
    assert any(c.language.recompute or c.vision.recompute for c in runnable)
    assert any(c.language.zero is not None for c in runnable)
    # what the engine refuses stays priced but modelled: Megatron's encoder replicated over cp (first_stage
    # cannot express it), and whatever the checks refuse today
    assert any(not x.runnable for x in extended)
    assert all(not x.runnable for x in extended if x.candidate.megatron and x.candidate.language.cp > 1)
    assert p.stats["runnable"] == sum(x.runnable for x in p.predictions)
    # what --write, auto and --trial use come from the runnable rows, extended ones included
    from ds_hetero.planner.trials import top_runnable

    assert p.best.runnable and all(x.runnable for x in top_runnable(p, 50))


def test_a_rule_the_engine_gains_moves_rows_to_modelled(monkeypatch):
    """Negative control: the verdict comes from the checks (called, not copied). An engine that refused
    every pipeline leaves no runnable pp row, and its plan picks no pipeline."""
    from ds_hetero import validation as checks

    real = checks.check_engine_support

    def refuse(cfg, *args, **kwargs):
        if cfg.language.pp > 1:
            raise HeteroConfigError("hetero_parallel.stages.language.pp", "refused by the test")
        real(cfg, *args, **kwargs)

    before = _plan(world=2)
    assert any(x.runnable and x.candidate.language.pp > 1 for x in before.predictions)
    monkeypatch.setattr(checks, "check_engine_support", refuse)
    after = _plan(world=2)
    assert any(x.candidate.language.pp > 1 for x in after.predictions)  # still priced
    assert not any(x.runnable and x.candidate.language.pp > 1 for x in after.predictions)


@pytest.mark.parametrize("memory_gb", [None, 0.0013, 0.002])
def test_dominance_pruning_changes_no_pick(monkeypatch, memory_gb):
    """The plan with pruning and the plan that prices every candidate pick the same rows (runnable
    pick, best overall, both baselines); pruning drops only rows with a fitting runnable sibling."""
    from ds_hetero.planner import dominance

    pruned = _plan(memory_gb=memory_gb)
    monkeypatch.setattr(dominance.Dominance, "dominated", lambda self, cand: False)
    full = _plan(memory_gb=memory_gb)
    assert len(full.predictions) > len(pruned.predictions)
    for pick in (lambda q: q.best, lambda q: q.best_overall, lambda q: q.best_megatron(),
                 lambda q: q.best_megatron(even=True), lambda q: q.best_homogeneous()):
        a, b = pick(pruned), pick(full)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.step_s == pytest.approx(b.step_s, rel=1e-12) and a.fits == b.fits
    fitting = {x.candidate for x in full.predictions if x.fits and x.runnable}
    kept = {x.candidate for x in pruned.predictions}
    for x in full.predictions:
        if x.candidate not in kept:
            assert any(s in fitting for s in dominance.lighter_siblings(x.candidate))


def test_lighter_siblings_hand_count():
    from ds_hetero.planner.candidate import Candidate, StageChoice
    from ds_hetero.planner.dominance import lighter_siblings

    c = Candidate("colocated", StageChoice(1, 4, recompute=True, zero=1), StageChoice(2, 2, recompute=True, zero=3), 2)
    sib = lighter_siblings(c)
    assert Candidate("colocated", StageChoice(1, 4, zero=1), StageChoice(2, 2, recompute=True, zero=3), 2) in sib
    assert Candidate("colocated", StageChoice(1, 4, recompute=True, zero=1), StageChoice(2, 2, zero=3), 2) in sib
    assert Candidate("colocated", StageChoice(1, 4, zero=1), StageChoice(2, 2, zero=3), 2) in sib
    assert Candidate("colocated", StageChoice(1, 4, recompute=True), StageChoice(2, 2, recompute=True), 2) in sib
    assert len(sib) == 4 and lighter_siblings(Candidate("colocated", StageChoice(1, 4), StageChoice(2, 2), 2)) == []


def test_pp_and_first_stage_picks_validate_and_train_on_two_ranks(tmp_path):
    """ds_config of a pp pick and of a first_stage pick: `ds-hetero validate` accepts them and a
    3-step 2-rank launch (the --trial launcher) trains with each."""
    from ds_hetero.cli import main
    from ds_hetero.trial_runner import launch_one

    p = _plan(world=2)
    pp = next(x for x in p.runnable if x.candidate.placement == "colocated" and x.candidate.language.pp == 2)
    fs = next(x for x in p.runnable if x.candidate.megatron and x.candidate.language.pp == 2)
    for tag, pred in (("pp", pp), ("first_stage", fs)):
        cfg = p.ds_config(pred)
        assert cfg["hetero_parallel"]["stages"]["language"]["pp"] == 2
        path = tmp_path / f"{tag}.json"
        path.write_text(json.dumps(cfg))
        assert main(["validate", str(path), "--world-size", "2", "--model", "tiny-llava"]) == 0
        step, err = launch_one("tiny-llava", cfg, 2, p.workload.seq_len, p.workload.image_tokens, 3, str(tmp_path),
                               tag, timeout_s=900)
        assert err == "" and 0 < step < float("inf"), err


def test_an_encoder_with_more_dp_ranks_than_a_pass_has_samples_hand_count():
    """8 samples per encoder pass on 16 encoder dp ranks (allowed: images are the encoder's unit):
    the busiest rank encodes one whole sample per pass, not 8 // 16 = 0 (which priced the encoder
    as free and its activations as zero)."""
    from ds_hetero.planner import machine_profile
    from ds_hetero.planner.candidate import Candidate, StageChoice
    from ds_hetero.planner.cost import stage_times
    from ds_hetero.planner.memory import vision_memory
    from ds_hetero.planner.model_source import load_hf_config
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.workload import Workload, samples_per_rank

    assert samples_per_rank(128, 16, 16) == 1 and samples_per_rank(128, 16, 8) == 1
    assert samples_per_rank(128, 4, 4) == 8 and samples_per_rank(128, 3, 4) == 11
    spec = model_spec(load_hf_config("ds_configs/planner/qwen2vl_vit6b_70b.json"))
    wl = Workload(seq_len=8192, image_tokens=4096, global_batch=128, dtype_bytes=2, zero=1)
    m = machine_profile("h100")
    lang = StageChoice(8, 4, 2, True)
    over = stage_times(spec, wl, m, "vision", StageChoice(4, 16), 16)[0]   # 8 samples / 16 ranks per pass
    exact = stage_times(spec, wl, m, "vision", StageChoice(4, 16), 8)[0]   # 16 samples / 16 ranks per pass
    assert over.forward > 0 and over.forward == pytest.approx(exact.forward, rel=1e-9)
    a_over = vision_memory(spec, wl, Candidate("colocated", StageChoice(4, 16), lang, 32, 16), True, 1).activations
    a_exact = vision_memory(spec, wl, Candidate("colocated", StageChoice(4, 16), lang, 32, 8), True, 1).activations
    assert a_over > 0 and a_over == pytest.approx(a_exact, rel=1e-9)
