"""The encoder's image assignment (ds_hetero/step/balance.py), its boundary plans and its config, without processes.

Determinism, the balance bounds of LPT, image granularity, never worse than position; the
boundary inputs the schedule builds from it route exactly and at the lower bound (simulated with
row labels); the vision stage's output on a rank's selected images is exactly the rows the plan
says that rank holds; config keys and errors.
"""

import itertools
import random

import pytest
import torch

from ds_hetero.step.balance import EncoderAssignment, Image, assign_images, encoder_assignment, loads, lpt
from ds_hetero.boundary import build_plan
from ds_hetero.config import load_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import adapter_for
from ds_hetero.step.step_plan import StepPlan
from ds_hetero.testing.parity import build_model
from ds_hetero.testing.uneven import LLAVA_IMAGES, QWEN_GRIDS, llava_uneven, qwen_uneven, rotate
from tests.helpers.plan_simulator import check


def _cfg(vision, language, batch=8, micro_batches=2, **section):
    return load_config({"train_batch_size": batch, "hetero_parallel": {
        "micro_batches": micro_batches, "stages": {"vision": vision, "language": language}, **section}}, 4)


# ---------------------------------------------------------------------------- the assignment function
def test_lpt_is_deterministic_and_within_its_bounds():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 4)
        costs = [rng.choice([0, 1, 5, 16, 64, 256, 1024]) for _ in range(rng.randint(0, 9))]
        ranks = lpt(costs, n)
        assert ranks == lpt(list(costs), n)  # a pure function of the costs
        per_rank = loads(costs, ranks, n)
        assert sum(per_rank) == sum(costs)
        if costs:
            # greedy list scheduling: max <= mean + largest item; LPT: <= (4/3 - 1/3n) OPT
            assert max(per_rank) <= sum(costs) / n + max(costs)
            opt = min(max(loads(costs, a, n)) for a in itertools.product(range(n), repeat=len(costs)))
            assert max(per_rank) <= (4 / 3 - 1 / (3 * n)) * opt + 1e-9


def test_ties_break_by_image_order_then_lowest_rank():
    assert lpt([4, 4, 4, 4, 4], 3) == [0, 1, 2, 0, 1]
    assert lpt([1, 9, 1], 2) == [1, 0, 1]


def test_tokens_is_never_worse_than_position():
    rng = random.Random(1)
    better = 0
    for _ in range(300):
        dp = rng.randint(2, 4)
        n_samples = dp * rng.randint(1, 3)
        images, position = [], []
        for s in range(n_samples):
            for k in range(rng.choice([0, 0, 1, 1, 2, 4])):
                c = rng.choice([16, 64, 256, 1024])
                images.append(Image(s, k, c, c * c))
                position.append(s // (n_samples // dp))
        tokens = assign_images(images, position, dp, "tokens")
        costs = [i.cost for i in images]
        t, p = max(loads(costs, tokens, dp), default=0), max(loads(costs, position, dp), default=0)
        assert t <= p
        better += t < p
        if t == p:  # equal: the position assignment is kept (fewer split samples)
            assert tokens == tuple(position)
    assert better > 100


def test_images_of_one_sample_land_on_different_ranks():
    # one sample with four equal images, three text-only samples: one image per rank
    images = tuple(Image(0, k, 16, 100) for k in range(4))
    rank = assign_images(images, [0, 0, 0, 0], 4, "tokens")
    a = EncoderAssignment(range(4), images, rank, (64, 0, 0, 0), 4)
    assert sorted(rank) == [0, 1, 2, 3]
    assert a.src_dp([0, 0, 1, 1]) == [((16, 0), (16, 1), (16, 2), (16, 3)), 0, 1, 1]
    assert [a.images_of(r) for r in range(4)] == [[(0, [k])] for k in range(4)]
    assert a.imbalance() == 1.0 and a.loads("rows") == [16] * 4
    assert assign_images(images, [0, 0, 0, 0], 4, "position") == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="balance"):
        assign_images(images, [0] * 4, 4, "random")


# ---------------------------------------------------------------------------- with the model adapters
def _batch(family, model, step=0, repeat=1):
    if family == "llava":
        return llava_uneven(model, rotate(LLAVA_IMAGES * repeat, step), seed=step)
    return qwen_uneven(model, rotate(QWEN_GRIDS * repeat, step), seed=step)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_boundary_inputs_of_balanced_assignments_route_exactly_at_the_lower_bound(family):
    model = build_model(family, seed=0)
    adapter = adapter_for(model)
    layouts = [  # (vision, language, placement)
        ({"dp": 4}, {"tp": 2, "dp": 2}, "colocated"),
        ({"dp": 4, "micro_batches": 1}, {"tp": 2, "dp": 2}, "colocated"),
        ({"tp": 2, "dp": 2}, {"dp": 4}, "colocated"),
        ({"dp": 2}, {"dp": 2}, "disaggregated"),
        ({"dp": 2, "ranks": [2, 3]}, {"tp": 2, "ranks": [0, 1], "dp": 1}, "disaggregated"),
    ]
    split = 0
    report = []
    for vision, language, placement in layouts:
        for balance in ("tokens", "position"):
            cfg = _cfg(vision, language, balance=balance, placement=placement)
            for step in range(3):
                samples = _batch(family, model, step)
                step_plan = StepPlan(cfg, adapter.encoders(), samples)
                for v in range(cfg.micro_batches_of("vision")):
                    inputs = step_plan.encoder_pass("vision", v).boundary
                    plan = build_plan(cfg.stages["vision"], cfg.language, inputs)
                    check(plan)  # every row where it belongs, sent == lower bound both ways
                    a = step_plan.encoder_pass("vision", v).assignment
                    for r in cfg.stages["vision"].ranks:
                        dp = cfg.stages["vision"].coord(r).dp
                        assert plan.for_rank(r).n_in == a.loads("rows")[dp]
                    split += sum(isinstance(d, tuple) for d in inputs.src_dp)
                    report.append((vision, balance, plan.rows_sent(), round(a.imbalance(), 2)))
    assert split > 0, report


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_each_rank_encodes_exactly_the_rows_the_plan_gives_it(family):
    # The vision stage on a rank's selected images == the full batch's rows at that rank's
    # global indices, in source order (ascending g): what the boundary plan assumes.
    model = build_model(family, seed=0).eval()
    adapter = adapter_for(model)
    vision = adapter.split()["vision"]
    cfg = _cfg({"dp": 4, "micro_batches": 1}, {"tp": 2, "dp": 2})
    samples = _batch(family, model, step=1)
    first = StepPlan(cfg, adapter.encoders(), samples).encoder_pass("vision", 0)
    a, inputs = first.assignment, first.boundary
    with torch.no_grad():
        full = vision(**adapter.vision_inputs(samples))
        owner = [r for i in range(inputs.num_samples) for n, r in inputs.source_runs(i) for _ in range(n)]
        assert len(owner) == full.shape[0]
        for dp in range(4):
            mine = [adapter.select_images(samples[p], ks) for p, ks in a.images_of(dp)]
            rows = vision(**adapter.vision_inputs(mine))
            want = full[[g for g, r in enumerate(owner) if r == dp]]
            assert rows.shape == want.shape and torch.allclose(rows, want, atol=1e-5, rtol=1e-5), dp


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_the_assignment_needs_only_token_ids(family):
    # Ranks that read a sample only lightly (input_ids) compute the same assignment.
    model = build_model(family, seed=0)
    adapter = adapter_for(model)
    cfg = _cfg({"dp": 4, "micro_batches": 1}, {"tp": 2, "dp": 2})
    samples = _batch(family, model)
    light = [{"input_ids": s["input_ids"], "light": True} for s in samples]
    assert encoder_assignment(cfg, adapter, samples, "vision", 0) == encoder_assignment(cfg, adapter, light, "vision", 0)
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
        assert sum(adapter.image_rows(s)) == adapter.image_token_count(s)


def test_qwen2_vl_images_must_be_separate_placeholder_runs():
    model = build_model("qwen2_vl", seed=0)
    adapter = adapter_for(model)
    sample = qwen_uneven(model, [[(1, 4, 4), (1, 4, 8)]])[0]
    ids, labels = sample["input_ids"], sample["labels"]
    cut = [k for k in range(len(ids)) if k not in (5, 6)]  # drop <end><start> between the images
    assert ids[5] == model.config.vision_end_token_id and ids[6] == model.config.vision_start_token_id
    bad = dict(sample, input_ids=ids[cut], labels=labels[cut])  # one run of 12 for two images
    with pytest.raises(ValueError, match="placeholder runs"):
        adapter.check_sample(bad, 3)


# ---------------------------------------------------------------------------- config
def test_balance_and_encoder_micro_batches_in_the_stage_configs():
    cfg = _cfg({"dp": 4, "micro_batches": 1}, {"tp": 2, "dp": 2})
    assert cfg.balance == "tokens" and cfg.micro_batches_of("vision") == 1 and cfg.micro_batches_of("language") == 2
    v, lang = cfg.stage_ds_config("vision"), cfg.stage_ds_config("language")
    # each engine's gradient_accumulation_steps == its backward calls per step
    assert (v["train_micro_batch_size_per_gpu"], v["gradient_accumulation_steps"]) == (2, 1)
    assert (lang["train_micro_batch_size_per_gpu"], lang["gradient_accumulation_steps"]) == (2, 2)
    assert _cfg({"dp": 4}, {"tp": 2, "dp": 2}, balance="position").balance == "position"
    assert _cfg({"dp": 4, "micro_batches": 2}, {"tp": 2, "dp": 2}).encoder_micro_batches == {}


@pytest.mark.parametrize("vision, section, field, words", [
    ({"dp": 4}, {"balance": "greedy"}, "hetero_parallel.balance", "tokens or position"),
    ({"dp": 4, "micro_batches": 0}, {}, "hetero_parallel.stages.vision.micro_batches", "positive"),
    ({"dp": 4, "micro_batches": 3}, {"micro_batches": 4}, "hetero_parallel.stages.vision.micro_batches", "divide"),
    ({"dp": 4, "micro_batches": 4}, {}, "hetero_parallel.stages.vision.micro_batches", "divide"),
    ({"dp": 2, "micro_batches": 1}, {"placement": "disaggregated"}, "hetero_parallel.stages.vision.micro_batches",
     "1F1B"),
    ({"dp": 4, "micro_batches": 1}, {"micro_batches": 4, "batch": 12}, "train_batch_size", "divisible"),
])
def test_config_errors_name_the_field(vision, section, field, words):
    section = dict(section)
    batch = section.pop("batch", 8)
    language = {"dp": 2} if section.get("placement") == "disaggregated" else {"tp": 2, "dp": 2}
    with pytest.raises(HeteroConfigError) as err:
        _cfg(vision, language, batch=batch, **section)
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_language_micro_batches_key_must_match_the_global_one():
    with pytest.raises(HeteroConfigError) as err:
        _cfg({"dp": 4}, {"tp": 2, "dp": 2, "micro_batches": 1})
    assert err.value.field == "hetero_parallel.stages.language.micro_batches"
    assert _cfg({"dp": 4}, {"tp": 2, "dp": 2, "micro_batches": 2}).micro_batches == 2


def test_loader_reads_in_full_what_each_vision_rank_encodes():
    # The engine's read pattern with balance "tokens": the language share first, then the samples
    # whose images this vision rank encodes (known from the light batch's token ids).
    from ds_hetero.data.loader import GlobalBatchLoader

    model = build_model("qwen2_vl", seed=0)
    adapter = adapter_for(model)
    data = _batch("qwen2_vl", model, step=2, repeat=2)  # 16 samples, one global batch
    cfg = _cfg({"dp": 4, "micro_batches": 1}, {"tp": 2, "dp": 2}, batch=16)
    loader = GlobalBatchLoader(data, 16, seed=3)
    encoded = set()
    light = loader.light_batch(0)
    assert all(s.get("light") for s in light)
    plan = StepPlan(cfg, adapter.encoders(), light)  # what the engine plans from the light batch
    for dp in range(4):
        batch = list(light)
        for p in plan.encoder_positions("vision", dp):  # what this vision rank reads in full
            batch[p] = data[loader.indices(0)[p]]
        for p, ks in plan.encoder_items("vision", 0, dp):
            assert not batch[p].get("light")
            adapter.select_images(batch[p], ks)  # the image fields are there
            encoded |= {(p, k) for k in ks}
    assert len(encoded) == sum(len(adapter.image_rows(s)) for s in data)


def test_fewer_encoder_passes_are_accepted_with_a_sharded_language_sequence():
    # each pass's rows are split per micro-batch by shard (tests/base/test_stage_options.py)
    cfg = _cfg({"dp": 4, "micro_batches": 1}, {"cp": 2, "dp": 2})
    assert cfg.micro_batches_of("vision") == 1
