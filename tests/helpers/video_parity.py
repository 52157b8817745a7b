"""Video parity runs for the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): ds_hetero against the
single-process Hugging Face model fed `pixel_values_videos` / `video_grid_thw` (Qwen2.5-VL: and
`second_per_grid_ts`) with its own `model(**batch).loss` (ds_hetero.testing.parity.train_both, family
"video:<family>").

`video_suite(family)` -> a launch function: every layout of RUNS on the same batches (clips of 1-4
temporal patches and of different frame sizes, images beside them in either order, text-only samples),
then the family's negative controls. `check_video(results, controls)` holds them to the bar.

Negative controls (the engine wrong, the reference right), each must leave the reference:
    temporal positions flattened   every temporal patch of a clip at the clip's first temporal position
                                   (get_vision_position_ids with no time interval for grids of t > 1):
                                   a video's positions computed as for a still image
    frames reversed                each clip's temporal patches encoded last first, so the rows of
                                   frame k land in the placeholders of frame t-1-k
    seconds ignored                (Qwen2.5-VL) every clip positioned as if 1 s per temporal patch,
                                   its `second_per_grid_ts` dropped
"""

from __future__ import annotations

import dataclasses

from ds_hetero.testing.parity import train_both
from tests.helpers.parity_checks import CLIP, RTOL, check_parity

V4 = {"dp": 4}
L22 = {"tp": 2, "dp": 2}

# (t, h, w): t temporal patches of h x w patches; every sample shape appears in several steps
VIDEO_ITEMS = [
    [("video", (2, 4, 4))], [("image", (1, 4, 8)), ("video", (3, 4, 8))], [], [("video", (2, 8, 8))],
    [("video", (1, 4, 4)), ("image", (1, 8, 4))], [("image", (1, 4, 4))], [("video", (4, 4, 4)), ("video", (2, 4, 8))],
    [("image", (1, 8, 8))],
]

RUNS = {
    "colocated vision dp4 + language tp2dp2 zero1 adamw": dict(
        layout={"vision": V4, "language": L22}, zero_stage=1, optimizer="adamw",
        inspect=lambda engine, batches: {**_split_samples(engine, batches), **_evaluated(engine, batches)}),
    "disaggregated vision dp2 (0-1) + language dp2 (2-3) zero1 sgd": dict(
        layout={"vision": {"dp": 2}, "language": {"dp": 2}}, zero_stage=1, placement="disaggregated"),
    "packed vision dp4 + language tp2dp2 zero2 sgd": dict(
        layout={"vision": V4, "language": L22}, zero_stage=2, hetero={"language_batching": "packed"},
        inspect=lambda engine, batches: _most_in_a_row(engine, batches)),
    "vision dp4 + language pp2dp2 zero1 sgd": dict(
        layout={"vision": V4, "language": {"dp": 2, "pp": 2}}, zero_stage=1),
    "vision tp2dp2 + language tp2 cp2 sp zero1 sgd": dict(
        layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
        zero_stage=1),
    "first_stage vision tp2 + language tp2pp2 zero1 sgd": dict(
        layout={"vision": {"tp": 2, "dp": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}}, zero_stage=1,
        placement="first_stage"),
}


def video_batches(family, model, steps, batch_size):
    from ds_hetero.families import adapter_for
    from ds_hetero.testing.video_samples import video_samples

    adapter = adapter_for(model)
    return [video_samples(model, (VIDEO_ITEMS * 2)[step % 3: step % 3 + batch_size], text_len=3 + step % 3,
                          seed=700 + step, frame_runs=adapter.FRAME_RUNS, seconds=adapter.SECONDS_FIELD is not None)
            for step in range(steps)]


def _split_samples(engine, batches):
    """How many samples had their vision items (images, clips, frames) encoded on several ranks."""
    from ds_hetero.step.balance import encoder_assignment

    split = 0
    for b in batches:
        for m in range(engine.config.micro_batches_of("vision")):
            plan = encoder_assignment(engine.config, engine.adapter, b, "vision", m)
            ranks = {}
            for image, rank in zip(plan.images, plan.rank):
                ranks.setdefault(image.sample, set()).add(rank)
            split += sum(len(r) > 1 for r in ranks.values())
    return {"split_samples": split}


def _evaluated(engine, batches):
    """eval_batch on the first batch before training, and the untrained HF model's own loss on it."""
    from ds_hetero.families import adapter_for
    from ds_hetero.testing.parity import VIDEO, build_model, reference_forward

    family = VIDEO + {"Qwen2VL": "qwen2_vl", "Qwen2_5_VL": "qwen2_5_vl", "Qwen3VL": "qwen3_vl",
                      "Qwen3_5": "qwen3_5"}[type(engine.model).__name__.replace("ForConditionalGeneration", "")]
    model = build_model(family, seed=7)
    return {"eval": (engine.eval_batch(batches[0]), reference_forward(family, model, adapter_for(model), batches[0])[2])}


def _most_in_a_row(engine, batches):
    """Per step: the most samples one packed row of the engine's plan holds."""
    from ds_hetero.step.step_plan import StepPlan

    out = []
    for b in batches:
        plan = StepPlan(engine.config, engine.adapter.encoders(), b, language_cost=engine.adapter.language_cost,
                        dense_attention=engine.adapter.dense_rows(engine.config.packed_attention))
        out.append(max(len(row) for d in range(engine.config.language.dp) for m in range(plan.micro_batches)
                       for row in plan.language_rows(d, m)))
    return {"most_in_a_row": out}


def _temporal_flattened(engine, batches):
    """The engine's positions with every clip's temporal patches at its first temporal position."""
    model = engine.adapter.model.model
    own = model.get_vision_position_ids

    def flat(start, grid, temp_merge_size=1, spatial_merge_size=1, time_interval=1.0, device=None):
        return own(start, grid, temp_merge_size, spatial_merge_size, 0 if int(grid[0]) > 1 else time_interval, device)

    model.get_vision_position_ids = flat
    return {}


def _seconds_ignored(engine, batches):
    """The engine's positions as if every clip had 1 s per temporal patch (the model's default)."""
    adapter = engine.adapter
    own, field = adapter.position_ids, adapter.SECONDS_FIELD
    adapter.position_ids = lambda batch, samples: own(batch, [{k: v for k, v in s.items() if k != field}
                                                              for s in samples])
    return {}


def reverse_frames(sample):
    """The sample with each clip's temporal patches in reverse order (patches are t-major)."""
    import torch

    grid = sample.get("video_grid_thw")
    if grid is None:
        return sample
    pixels, out, start = sample["pixel_values_videos"], [], 0
    for t, h, w in grid.reshape(-1, 3).tolist():
        clip = pixels[start:start + t * h * w]
        out.append(clip.reshape(t, h * w, -1).flip(0).reshape(t * h * w, -1))
        start += t * h * w
    return {**sample, "pixel_values_videos": torch.cat(out)}


def _frames_reversed(engine, batches):
    port = engine.adapter.encoders()["vision"]
    engine.adapter._ports["vision"] = dataclasses.replace(port, select=lambda s, ks: port.select(reverse_frames(s), ks))
    return {}


CONTROLS = {"temporal positions flattened": _temporal_flattened, "frames reversed": _frames_reversed,
            "seconds ignored": _seconds_ignored}


def video_suite(rank, world_size, family, controls=(), runs=tuple(RUNS)):
    """{run name: train_both's result} of `family` on every layout of `runs` (names in RUNS), then
    each control (names in CONTROLS) on the first layout; a launch case (ds_hetero.testing.cases)."""
    out = {}
    for name in runs:
        out[name] = train_both(rank, world_size, "video:" + family, steps=5, clip=CLIP, make_data=video_batches,
                               **RUNS[name])
    for name in controls:
        out["control: " + name] = train_both(rank, world_size, "video:" + family, steps=3, clip=CLIP,
                                             make_data=video_batches, **{**RUNS[runs[0]], "inspect": CONTROLS[name]})
    return out


def check_video(results):
    """The runs at the bar; each control away from the reference. Returns rank 0's {name: (worst loss
    distance from the HF model's, worst relative weight error)}, runs and controls."""
    runs = [{n: r for n, r in per_rank.items() if not n.startswith("control")} for per_rank in results]
    check_parity(runs)
    for name, r in runs[0].items():
        assert r["stages_held"], name
        if "split_samples" in r:  # balancing placed one sample's items (a clip, its frames) on several ranks
            assert r["split_samples"] > 0, name
        if "eval" in r:  # eval_batch with clips: the untrained model's own loss
            got, want = r["eval"]
            assert abs(got - want) <= RTOL * abs(want), (name, r["eval"])
        if "packed" in name:  # packing happened: some row held several samples, clips among them
            assert max(r["most_in_a_row"]) > 1, (name, r["most_in_a_row"])
    distances = {}
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            loss = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["hf_losses"]))
            if name.startswith("control"):  # fails the bar by far on the weights (its losses may stay
                # near: positions move a tiny random model's loss little, its weights much)
                assert r["weight_err"][0] > 100 * RTOL, (name, loss, r["weight_err"])
            if rank == 0:
                distances[name] = (loss, r["weight_err"][0])
    return distances
