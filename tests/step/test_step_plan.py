"""StepPlan (pure, no processes): the samples each stage's ranks handle, the encoder passes, the
boundary inputs of every exchange, for any number of encoder stages.

Adding an encoder stage is a change to a model adapter (its EncoderPort) and to the config, not to
the schedule: the two-encoder plan below is built from a config with a second encoder stage and an
adapter that declares two ports, and everything the schedules read of it is checked.
"""

from __future__ import annotations

import torch

from ds_hetero.boundary import build_plan
from ds_hetero.config import load_config
from ds_hetero.models.adapter import EncoderPort, StageAdapter
from ds_hetero.models.item_cost import transformer_cost
from ds_hetero.step.step_plan import StepPlan
from ds_hetero.step.shares import stage_samples

IMAGE, AUDIO, TEXT = 90, 91, 5
IMAGE_ROWS = 4  # rows per image
CLIP_ROWS = (2, 6)  # rows of the audio clips, by their length


def _sample(images: int, clips: list[int], text: int = 3) -> dict:
    ids = [TEXT] * text
    for _ in range(images):
        ids += [IMAGE] * IMAGE_ROWS + [TEXT]
    for rows in clips:
        ids += [AUDIO] * rows + [TEXT]
    ids = torch.tensor(ids)
    return {"input_ids": ids, "labels": ids.clone()}


def _runs(sample: dict, token: int) -> list[int]:
    """Lengths of the runs of `token` in the sample: one run per item."""
    runs, n = [], 0
    for t in sample["input_ids"].tolist() + [None]:
        if t == token:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def _port(name: str, token: int) -> EncoderPort:
    return EncoderPort(name, token, rows=lambda s: _runs(s, token),
                       cost=lambda rows: transformer_cost(rows, rows, 8, 16),
                       select=lambda s, ks: s, inputs=lambda samples: {})


class TwoEncoderAdapter(StageAdapter):
    """What a model family with an image and an audio encoder declares (no model needed here)."""

    ENCODER_STAGES = ("vision", "audio")

    def __init__(self):
        self.model = None
        self._ports = {"vision": _port("vision", IMAGE), "audio": _port("audio", AUDIO)}


def _config(vision: dict, audio: dict, language: dict, batch: int = 8, micro_batches: int = 2, world: int = 4,
            balance: str = "tokens", placement: str = "colocated"):
    return load_config({
        "train_batch_size": batch,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "hetero_parallel": {"micro_batches": micro_batches, "balance": balance, "placement": placement,
                            "stages": {"vision": vision, "audio": audio, "language": language}},
    }, world)


def _batch() -> list[dict]:
    # image only, audio only, both, neither; clips of different lengths
    shapes = [(1, []), (0, [2]), (2, [6]), (0, []), (1, [6, 2]), (0, [6]), (3, []), (1, [2])]
    return [_sample(i, c, text=3 + k % 3) for k, (i, c) in enumerate(shapes)]


def test_a_plan_for_two_encoder_stages_gives_each_its_passes_and_exchanges():
    adapter = TwoEncoderAdapter()
    cfg = _config({"dp": 4}, {"tp": 2, "dp": 2, "micro_batches": 1}, {"tp": 2, "dp": 2})
    adapter.check_stages(cfg)  # the config's encoders are exactly the adapter's
    samples = _batch()
    plan = StepPlan(cfg, adapter.encoders(), samples)

    assert plan.micro_batches == 2 and plan.micro_batch_size == 4 and plan.language_share == 2
    # language shares: the single-process cut, as stage_samples gives it
    for m in range(2):
        for dp in range(2):
            assert plan.language_samples(dp, m) == stage_samples(cfg, "language", dp, m)
    # vision: one pass per language micro-batch; audio: one pass for both
    assert [p.feeds for p in plan.passes["vision"]] == [range(0, 1), range(1, 2)]
    assert [p.feeds for p in plan.passes["audio"]] == [range(0, 2)]
    assert plan.pass_feeding("audio", 1) is plan.passes["audio"][0]
    # each encoder's exchange carries that encoder's rows only
    for name, token in (("vision", IMAGE), ("audio", AUDIO)):
        for p in plan.passes[name]:
            assert list(p.boundary.token_counts) == [int((samples[i]["input_ids"] == token).sum())
                                                     for i in p.assignment.samples]
            assert list(p.boundary.dst_dp) == [(i % 4) // 2 for i in p.assignment.samples]
            # every item encoded exactly once, by one dp rank
            encoded = sorted((i, k) for dp in range(cfg.stages[name].dp)
                             for i, ks in plan.encoder_items(name, p.index, dp) for k in ks)
            assert encoded == sorted((i, k) for i in p.assignment.samples for k in range(len(_runs(samples[i], token))))
            # the boundary plan delivers to each language rank the rows of its share, from the
            # ranks that encoded them
            routes = build_plan(cfg.stages[name], cfg.language, p.boundary)
            for r in cfg.stages[name].ranks:
                assert routes.for_rank(r).n_in == p.assignment.loads("rows")[cfg.stages[name].coord(r).dp]
            for r in cfg.language.ranks:
                dp = cfg.language.coord(r).dp
                want = sum(plan.rows_of(name, dp, m) for m in p.feeds)
                assert routes.for_rank(r).n_out == want, (name, r)
    # loss scaling: the language loss carries its dp x micro-batches; each encoder its own dp x passes
    assert plan.language_scale() == 2 * 2
    assert plan.encoder_scale("vision") == 4 * 2 / 2 and plan.encoder_scale("audio") == 2 * 1 / 2
    # the audio balance spreads the long clips: its two dp ranks encode equal costs here
    assert plan.passes["audio"][0].assignment.imbalance() < 1.2


def test_the_plan_needs_only_token_ids():
    adapter = TwoEncoderAdapter()
    cfg = _config({"dp": 2, "ranks": [0, 1]}, {"dp": 1, "ranks": [2]}, {"dp": 1, "ranks": [3]}, batch=8,
                  micro_batches=2, placement="disaggregated")
    samples = _batch()
    light = [{"input_ids": s["input_ids"]} for s in samples]
    full, thin = StepPlan(cfg, adapter.encoders(), samples), StepPlan(cfg, adapter.encoders(), light)
    assert full.passes == thin.passes


def test_evaluation_plans_one_pass_per_micro_batch_and_any_number_of_them():
    adapter = TwoEncoderAdapter()
    cfg = _config({"dp": 4}, {"tp": 2, "dp": 2, "micro_batches": 1}, {"tp": 2, "dp": 2})
    samples = _batch() + _batch()  # 16 samples at the training micro-batch size 4: 4 micro-batches
    plan = StepPlan(cfg, adapter.encoders(), samples, micro_batches=4, per_micro_batch=True)
    assert [len(plan.passes[n]) for n in ("vision", "audio")] == [4, 4]
    assert plan.language_samples(1, 3) == range(14, 16)


def test_a_config_naming_an_encoder_the_model_lacks_is_refused_by_its_adapter():
    import pytest

    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava

    cfg = _config({"dp": 4}, {"tp": 2, "dp": 2}, {"tp": 2, "dp": 2})
    with pytest.raises(HeteroConfigError) as err:
        adapter_for(tiny_llava("clip")).check_stages(cfg)
    assert err.value.field == "hetero_parallel.stages.audio"
    # and the two-encoder adapter refuses a config without its audio stage
    one = load_config({"train_batch_size": 8, "hetero_parallel": {"stages": {"vision": {"dp": 4},
                                                                            "language": {"dp": 4}}}}, 4)
    with pytest.raises(HeteroConfigError) as err:
        TwoEncoderAdapter().check_stages(one)
    assert err.value.field == "hetero_parallel.stages.audio" and "missing" in str(err.value)


def test_the_plans_item_rows_are_what_the_batch_agreement_digests():
    """The agreement digests the plan's item rows instead of reading every sample's token ids
    again: they must be `port.rows` of every sample, per port in the adapter's order, whatever
    the passes and the balance (and they must tell two batches apart that the rows tell apart)."""
    from ds_hetero.data.agreement import digest

    adapter = TwoEncoderAdapter()
    samples = _batch()
    direct = [tuple(tuple(port.rows(s)) for port in adapter.encoders().values()) for s in samples]
    for balance in ("tokens", "position"):
        cfg = _config({"dp": 4}, {"tp": 2, "dp": 2, "micro_batches": 1}, {"tp": 2, "dp": 2}, balance=balance)
        plan = StepPlan(cfg, adapter.encoders(), samples)
        assert plan.item_rows(len(samples)) == direct
        assert digest(plan.item_rows(len(samples))) == digest(direct)
    # negative control: a sample with one more audio clip changes the rows and the digest
    other = samples[:3] + [_sample(0, [2])] + samples[4:]
    other_plan = StepPlan(cfg, adapter.encoders(), other)
    assert other_plan.item_rows(len(other)) != direct
    assert digest(other_plan.item_rows(len(other))) != digest(direct)
