"""Qwen2-VL and Qwen2.5-VL with videos: a clip (`pixel_values_videos`, `video_grid_thw`: t temporal patches,
one placeholder run) is a vision item beside the images, balanced over the vision stage's dp ranks by its
cost, its rows delivered into the video placeholders in sequence order; M-RoPE positions from the model's
own `get_rope_index` on the full sequence (Qwen2.5-VL: spaced in time by `second_per_grid_ts`). Against
the single-process Hugging Face model fed the processor's own fields, with its own loss.

fp32, 5 steps of 2 micro-batches, clipping active: losses 1e-5 relative, grad norms 1e-4, every weight
1e-5; boundary bytes at the lower bound. Layouts (tests/helpers/video_parity.py RUNS): colocated vision
dp4 + language tp2 dp2, disaggregated, packed, language pp2, vision tp2 dp2 + language tp2 cp2 with
sequence parallelism, first_stage (vision tp2 on the first pipeline stage of language tp2 pp2);
balance "tokens"; one 4-rank launch for both families.

Negative controls (3 steps, colocated): each clip's temporal positions flattened (every temporal patch at
the clip's first temporal position: a video positioned as a still image), on both families, and on
Qwen2.5-VL each clip's `second_per_grid_ts` dropped (1 s per temporal patch); each must leave the
reference (weights by more than 100x the tolerance).

In the same launch, the main job (recipes/train_llava.py --model-family qwen2.5-vl --videos,
ds_configs/qwen_video.json) trains 4 steps on the synthetic moving-shape clips (toy/shape_clips.py).
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.video_parity import check_video, video_suite

pytestmark = pytest.mark.distributed


def _recipe(rank, world_size, tmp):
    """The main job on the synthetic clips: --model-family qwen2.5-vl --videos, ds_configs/qwen_video.json."""
    from tests.helpers.driver_report import load_recipe
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    recipe = load_recipe(root, "train_llava")
    summary = os.path.join(tmp, "video_recipe.json")
    recipe.main(["--steps", "4", "--samples", "64", "--model-family", "qwen2.5-vl", "--videos", "--summary-json",
                 summary, "--deepspeed_config", os.path.join(root, "ds_configs", "qwen_video.json")])
    if rank == 0:
        with open(summary) as f:
            return json.load(f)
    return None


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    flattened = ("temporal positions flattened",)
    cases = {"qwen2_vl": (video_suite, {"family": "qwen2_vl", "controls": flattened}),
             "qwen2_5_vl": (video_suite, {"family": "qwen2_5_vl", "controls": flattened + ("seconds ignored",)}),
             "recipe": (_recipe, {"tmp": str(tmp_path_factory.mktemp("video"))})}
    return launch_cases(cases, world_size=4, timeout=2400)


def test_qwen2_vl_videos_match_the_single_process_model(launched):
    print(check_video(launched["qwen2_vl"]))


def test_qwen2_5_vl_videos_match_the_single_process_model(launched):
    print(check_video(launched["qwen2_5_vl"]))


def test_the_main_job_trains_on_synthetic_clips(launched):
    summary = launched["recipe"][0]
    assert summary["steps"] == 4 and "vision tp1 cp1 dp4" in summary["layout"], summary["layout"]
    losses = summary["losses"]
    assert losses[-1] < losses[0], losses  # it learns (seen: 5.74 -> 4.91 in 4 steps)
