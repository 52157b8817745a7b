"""The main job's real-data path under the real launcher: each rank reads only its stages' samples, ahead of the step.

One `deepspeed --num_gpus 4` launch of tests/helpers/sft_workers_driver.py: recipes/train_llava.py, tiny
Qwen2-VL, --data shapes_llava.json, the default layout (vision dp4, language tp2 dp2, 2 micro-batches,
global batch 16: 3 steps an epoch), five runs (the driver's docstring). Checked:
- a rank encodes exactly the rows at its plan's positions, fewer than the global batch every step (the
  old path encoded all 16 every step on every rank: the negative control's count);
- the losses of a run with 2 data workers saved after 2 steps and resumed with --load (mid-epoch, workers
  again) are the 4-step run's (without workers) own bit for bit;
- the shipped clips (shapes_videos.jsonl), decoded in 2 data workers per rank, give the losses of the run
  that decodes them in the rank itself, bit for bit;
- the HF Trainer recipe (recipes/hf_trainer_llava.py --data, --dataloader_num_workers 2) on the same
  config and rows logs the main job's losses (tiny LLaVA, shapes_messages.jsonl, 2 steps) within 1e-6, and
  `hetero/data_wait_s`;
- the Accelerate recipe (`accelerate launch`, recipes/accelerate_llava.py --data) on the same rows: the same
  losses (1e-6);
- an image broken past its header (its PNG chunks verify, its pixel stream is not zlib), found only when a
  worker decodes it, stops every rank with the same error naming file and row, never advising the skip.
"""

import json
import os
import shutil
import struct
import zlib

import pytest

from tests.helpers.driver_report import launch_driver

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")


def _broken_past_header(src: str, dst: str) -> None:
    """A copy of PNG `src` whose pixel data is zeros (not a zlib stream) under a correct CRC."""
    blob, out, at = open(src, "rb").read(), bytearray(), 8
    out += blob[:8]
    while at < len(blob):
        size, kind = struct.unpack(">I4s", blob[at:at + 8])
        body = blob[at + 8:at + 8 + size]
        if kind == b"IDAT":
            body = bytes(len(body))
        out += struct.pack(">I4s", len(body), kind) + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        at += 12 + size
    open(dst, "wb").write(bytes(out))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_workers")
    rows = json.load(open(os.path.join(DATA, "shapes_llava.json")))
    shutil.copytree(os.path.join(DATA, "images"), out / "images")
    bad = rows[5]["image"][0]  # row 5 has two images: the first is broken
    _broken_past_header(os.path.join(DATA, bad), str(out / bad))
    json.dump(rows, open(out / "late_bad.json", "w"))
    return launch_driver(ROOT, "sft_workers_driver.py", out, timeout=900), str(out / "late_bad.json")


def test_each_rank_encodes_only_its_stages_rows(ranks):
    reports, _ = ranks
    for rank, r in enumerate(reports):
        counted = r["counted"]
        assert len(counted["planned"]) == 4
        assert counted["reads"] == sorted(i for step in counted["planned"] for i in step), rank
        assert all(len(step) < 16 for step in counted["planned"]), (rank, counted["planned"])


def test_workers_and_resume_give_the_runs_own_losses(ranks):
    reports, _ = ranks
    full = reports[0]["counted"]["losses"]
    assert len(full) == 4
    assert reports[0]["saved"] == full[:2] and reports[0]["resumed"] == full[2:]  # bit for bit, with workers


def test_clips_decoded_in_workers_give_the_runs_own_losses(ranks):
    reports, _ = ranks
    clips = reports[0]["clips"]
    assert len(clips) == 2 and reports[0]["clips_workers"] == clips, reports[0]


def test_a_row_broken_past_its_header_stops_every_rank_alike(ranks):
    reports, path = ranks
    errors = [r["late_bad"] for r in reports]
    assert all(errors) and len(set(errors)) == 1, errors
    assert f"{path}: row 5" in errors[0] and "fix or remove the row" in errors[0], errors[0]
    assert "--skip-bad-rows" not in errors[0] and "skip_bad_rows=True" not in errors[0], errors[0]


def test_the_trainer_recipe_reads_the_same_rows(ranks):
    reports, _ = ranks
    main, trainer = reports[0]["main_llava"], reports[0]["trainer"]
    assert len(main) == 2 and trainer["losses"] == pytest.approx(main, rel=1e-6), (trainer, main)
    assert all(w is not None and w >= 0 for w in trainer["data_wait"]), trainer


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory):
    """recipes/accelerate_llava.py --data under `accelerate launch` (ds_configs/accelerate_colocated.yaml:
    4 processes, ds_configs/llava_colocated.json), 2 steps on shapes_messages.jsonl."""
    import subprocess
    import sys

    from tests.helpers.driver_report import free_port

    out = tmp_path_factory.mktemp("sft_accelerate")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [f"{os.path.dirname(sys.executable)}/accelerate", "launch", "--config_file", "ds_configs/accelerate_colocated.yaml",
         "--main_process_port", free_port(), "recipes/accelerate_llava.py", "--data",
         os.path.join(DATA, "shapes_messages.jsonl"), "--steps", "2", "--summary-json", str(out / "acc.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "acc.json").read_text())


def test_the_accelerate_recipe_reads_the_same_rows(ranks, accelerate_run):
    main, losses = ranks[0][0]["main_llava"], accelerate_run["losses"]
    assert [losses[str(k)] for k in range(2)] == pytest.approx(main, rel=1e-6), (losses, main)
