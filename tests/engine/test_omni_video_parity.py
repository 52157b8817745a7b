"""Qwen2.5-Omni thinker with videos: the vision stage encodes images and videos, the language stage
takes its rows at image and video placeholders alike, TMRoPE positions come from the full sequence
(the videos' grids and seconds per temporal patch included), against the single-process Hugging
Face thinker on the processor's own fields (`pixel_values_videos`, `video_grid_thw`,
`video_second_per_grid`), with the thinker's own `model(**batch).loss`.

fp32, 5 steps of 2 micro-batches, clipping active; losses, global norms and every weight within
1e-5. Samples mix images, videos and clips (interleaved in any order), and none.

Negative controls (one launch with the parity runs): the videos' positions taken as if they
were 1 s per temporal patch (their real seconds ignored), and a sample's vision rows delivered
images first, then videos (not in sequence order). Both leave the reference: weights by more
than 100x the tolerance, losses beyond it.
"""

import dataclasses

import pytest

from ds_hetero.testing.launch import run_distributed
from ds_hetero.testing.parity import train_both

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3

VIDEO_ITEMS = [
    [("video", (2, 4, 4))], [("audio", 20), ("video", (2, 4, 8))], [("video", (2, 4, 4)), ("image", (1, 4, 4))],
    [], [("image", (1, 8, 4)), ("audio", 17), ("video", (1, 4, 4))], [("audio", 24)],
    [("video", (1, 8, 4)), ("audio", 13), ("image", (1, 4, 8))], [("image", (1, 4, 4))],
]

RUNS = {
    "colocated vision tp2dp2 + audio dp4 + language tp2dp2 zero1 adamw": dict(
        layout={"vision": {"tp": 2, "dp": 2}, "audio": {"dp": 4}, "language": {"tp": 2, "dp": 2}},
        zero_stage=1, hetero={"balance": "tokens"}),
    "mixed vision dp2 on the language ranks [0,1] + audio dp2 [2,3] + language tp2 zero2 sgd": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                "language": {"tp": 2, "dp": 1, "ranks": [0, 1]}},
        zero_stage=2, placement="mixed", optimizer="sgd"),
}


def video_batches(family, model, steps, batch_size):
    from ds_hetero.testing.omni_samples import omni_samples

    return [omni_samples(model, (VIDEO_ITEMS * 2)[step % 3: step % 3 + batch_size], text_len=3 + step % 3,
                         seed=500 + step) for step in range(steps)]


def _seconds_ignored(engine, batches):
    """Positions computed as if every video had 1 s per temporal patch."""
    import torch

    adapter, own = engine.adapter, engine.adapter.position_ids

    def wrong(batch, samples):
        return own(batch, [{**s, "video_second_per_grid": torch.ones_like(s["video_second_per_grid"])}
                           if s.get("video_grid_thw") is not None else s for s in samples])

    adapter.position_ids = wrong
    return {}


def _images_first(engine, batches):
    """A sample's vision items encoded images first, then videos (rows no longer in sequence order), in
    the samples whose items all have the same row count (the 8-row video before the 8-row image)."""
    import torch

    adapter = engine.adapter
    port = adapter.encoders()["vision"]
    img = adapter.image_token_id

    def wrong(sample, ks):
        if sample.get("video_grid_thw") is None:
            return port.select(sample, ks)
        from ds_hetero.families.qwen2_5_omni.adapter import typed_runs

        runs = typed_runs(sample["input_ids"], port.ids)
        if len({n for _, n in runs}) > 1:  # keep the row counts (the exchange checks them): equal items only
            return port.select(sample, ks)
        kinds = [t for t, _ in runs]
        items = adapter.vision_items(sample)
        items = [it for it, t in zip(items, kinds) if t == img] + [it for it, t in zip(items, kinds) if t != img]
        return {"pixel_values": torch.cat([items[k][0] for k in ks]),
                "image_grid_thw": torch.cat([items[k][1] for k in ks])}

    adapter._ports["vision"] = dataclasses.replace(port, select=wrong)
    return {}


def _suite(rank, world_size):
    out = {name: train_both(rank, world_size, "omni", steps=5, clip=CLIP, make_data=video_batches, **kw)
           for name, kw in RUNS.items()}
    first = RUNS[next(iter(RUNS))]
    for name, inspect in (("seconds ignored", _seconds_ignored), ("images first", _images_first)):
        out[name] = train_both(rank, world_size, "omni", steps=5, clip=CLIP, make_data=video_batches,
                               inspect=inspect, **first)
    return out


def test_omni_videos_match_the_single_process_thinker_and_controls_fail():
    for rank, per_rank in enumerate(run_distributed(_suite, world_size=4, timeout=900)):
        for name in RUNS:
            r = per_rank[name]
            assert len(r["losses"]) == len(r["hf_losses"]) == 5, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(want - hf) <= RTOL * abs(hf), (rank, name, r["ref_losses"], r["hf_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name)
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)
        for name in ("seconds ignored", "images first"):
            r = per_rank[name]
            worst = max(abs(got - hf) / abs(hf) for got, hf in zip(r["losses"], r["hf_losses"]))
            # the parity checks above fail: the weights by far (seen: 0.045 and 0.36 relative), the
            # losses too (seen: 1.4e-5 positions, 7.7e-4 order: video positions move a tiny
            # random model's loss little, its weights much)
            assert worst > RTOL, (rank, name, r["losses"], r["hf_losses"])
            assert r["weight_err"][0] > 100 * RTOL, (rank, name, r["weight_err"])
