"""Qwen3-VL and Qwen3.5 with videos: a clip's temporal patches are separate placeholder runs (each after
its timestamp text, as their processors write them), so every frame is its own vision item, balanced
over the vision stage's dp ranks by cost beside the images and delivered into its video placeholders in
sequence order; Qwen3-VL's DeepStack levels travel with the rows to image and video positions alike.
Against the single-process Hugging Face model fed `pixel_values_videos` / `video_grid_thw`, its own loss.

fp32, 5 steps of 2 micro-batches, clipping active: losses 1e-5 relative, grad norms 1e-4, every weight
1e-5; boundary bytes at the lower bound. Layouts (tests/helpers/video_parity.py RUNS): colocated vision
dp4 + language tp2 dp2, disaggregated, packed, language pp2, vision tp2 dp2 + language tp2 cp2 with
sequence parallelism, first_stage (vision tp2 on the first pipeline stage of language tp2 pp2); balance
"tokens"; one 4-rank launch for both families.

Negative control: each clip's frames encoded last first (frame k's rows in frame t-1-k's placeholders):
it must leave the reference (weights by more than 100x the tolerance).
"""

import pytest

from ds_hetero.testing.cases import launch_cases
from tests.helpers.video_parity import check_video, video_suite

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def launched():
    reversed_ = ("frames reversed",)
    cases = {"qwen3_vl": (video_suite, {"family": "qwen3_vl", "controls": reversed_}),
             "qwen3_5": (video_suite, {"family": "qwen3_5", "controls": reversed_})}
    return launch_cases(cases, world_size=4, timeout=2400)


def test_qwen3_vl_videos_match_the_single_process_model(launched):
    print(check_video(launched["qwen3_vl"]))


def test_qwen3_5_videos_match_the_single_process_model(launched):
    print(check_video(launched["qwen3_5"]))
