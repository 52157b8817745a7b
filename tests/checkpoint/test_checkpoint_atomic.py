"""A kill at any moment of a save leaves the previous checkpoint loadable.

Each kill launch (2 ranks, colocated: rank 0 and 1 both hold vision and language) trains one
step with the data loader, saves global_step1, trains a second step, then saves global_step2
with DS_HETERO_CHECKPOINT_KILL making one rank SIGKILL itself at one point of the save
(ds_hetero/checkpoint/publish.py). The points cover: nothing written, one of a rank's two
stages written, one rank finished while the other has not, every file written but nothing
renamed, the folder renamed but `latest` not yet updated. One more launch then loads every
folder's `latest` and checks it resumes exactly (the same loss as the uninterrupted second
step, from the loader's saved position), and that saving again there works.
"""

import json
import os

import pytest
import torch

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

KILLS = ["begin:1", "stage_written:1", "rank_written:1", "before_rename:0", "before_latest:0"]
LAYOUT = {"vision": {"tp": 1, "dp": 2}, "language": {"tp": 2, "dp": 1}}


def _engine():
    import ds_hetero
    from ds_hetero.toy import ShapesCaptionDataset
    from ds_hetero.toy import tiny_llava
    from tests.helpers.checkpoint_reference import config, make_optimizer

    model = tiny_llava("clip", seed=5)
    data = ShapesCaptionDataset.for_llava(model.config, size=32, seed=0)
    return ds_hetero.initialize(model, config(LAYOUT, zero=1, batch_size=4), training_data=data,
                                optimizer=make_optimizer)


def _save_and_die(rank, world_size, save_dir, kill):
    engine = _engine()
    engine.train_batch()
    engine.save_checkpoint(save_dir)
    loss = engine.train_batch().loss
    if rank == 0:
        with open(os.path.join(save_dir, "second_loss.json"), "w") as f:
            json.dump(loss, f)
    os.environ["DS_HETERO_CHECKPOINT_KILL"] = kill
    engine.save_checkpoint(save_dir)
    return "survived"


def _resume_all(rank, world_size, dirs):
    engine = _engine()
    out = []
    for d in dirs:
        tag = engine.load_checkpoint(d)
        out.append((tag, engine.global_steps, engine.train_batch().loss))
    engine.save_checkpoint(dirs[1])  # over a leftover .partial folder
    engine.save_checkpoint(dirs[-1])  # over an unpublished complete global_step2
    from ds_hetero.testing.parity import full_named_parameters

    # what `checkpoint convert --to-hf` must write (numpy: a tensor would travel by shared memory,
    # gone once this rank exits)
    weights = {n: p.numpy() for n, p in full_named_parameters(engine).items()}
    engine.groups.destroy()
    return out, weights


def test_kill_during_save_leaves_previous_checkpoint(tmp_path, capsys):
    dirs = []
    for kill in KILLS:
        d = str(tmp_path / kill.replace(":", "_rank"))
        dirs.append(d)
        with pytest.raises(AssertionError, match="died with exit code -9"):
            run_distributed(_save_and_die, world_size=2, timeout=600, grace_s=2, save_dir=d, kill=kill)
        with open(os.path.join(d, "latest")) as f:
            assert f.read() == "global_step1", kill
        published = os.path.isdir(os.path.join(d, "global_step2"))
        assert published == (kill == "before_latest:0"), (kill, os.listdir(d))
        assert published or os.path.isdir(os.path.join(d, ".global_step2.partial")), (kill, os.listdir(d))
    # rank_written:1 - rank 1 finished every file of its own and died; nothing was published
    stage_dir = os.path.join(dirs[2], ".global_step2.partial", "language", "global_step2")
    assert os.path.isfile(os.path.join(stage_dir, "zero_pp_rank_0_mp_rank_01_optim_states.pt"))

    results = run_distributed(_resume_all, world_size=2, timeout=600, dirs=dirs)
    weights = results[0][1]
    results = [r[0] for r in results]
    for d, (tag, step, loss) in zip(dirs, results[0]):
        with open(os.path.join(d, "second_loss.json")) as f:
            uninterrupted = json.load(f)
        assert (tag, step) == ("global_step1", 1), d
        assert loss == uninterrupted, (d, loss, uninterrupted)  # same layout: exact
    assert results[0] == results[1]
    for d in (dirs[1], dirs[-1]):
        with open(os.path.join(d, "latest")) as f:
            assert f.read() == "global_step2"
        assert not os.path.exists(os.path.join(d, ".global_step2.partial"))

    _check_cli(dirs[-1], weights, tmp_path / "hf", capsys)


def _check_cli(ckpt, weights, out, capsys):
    """`ds-hetero checkpoint info` prints the manifest; `convert --to-hf` writes what from_pretrained loads."""
    from transformers import LlavaForConditionalGeneration

    from ds_hetero.cli import main

    capsys.readouterr()
    assert main(["checkpoint", "info", ckpt]) == 0
    text = capsys.readouterr().out
    assert "checkpoint global_step2  step 2" in text, text
    assert "language  tp2 cp1 dp1 ranks [0, 1]" in text and "vision    tp1 cp1 dp2 ranks [0, 1]" in text, text
    assert "data: global_steps 2, samples_consumed 8" in text and "deepspeed" in text, text
    assert main(["checkpoint", "info", str(out)]) == 1  # not a checkpoint: an error, not a traceback

    assert main(["checkpoint", "convert", ckpt, "--to-hf", str(out)]) == 0
    model = LlavaForConditionalGeneration.from_pretrained(str(out))
    got = dict(model.named_parameters())
    assert set(got) == set(weights) and len(weights) > 40
    for name, want in weights.items():
        assert torch.equal(got[name].detach(), torch.from_numpy(want)), name
