"""The Trainer's data path without processes: collated batches split per sample, conversions, the errors
that name the fix, the inline section, the loss options refused by name and a subclass's optimizer
rebuilt per stage."""

import numpy as np
import pytest
import torch

from ds_hetero.data import as_sample_list, split_collated
from ds_hetero.toy import ShapesCaptionDataset
from ds_hetero.errors import HeteroConfigError
from ds_hetero.families import adapter_for
from ds_hetero.toy import tiny_llava, tiny_qwen2_vl
from tests.helpers.collate import _collate


def _same(a, b):
    assert set(a) == set(b), (set(a), set(b))
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_split_collated_gives_back_each_sample(family, side):
    if family == "llava":
        model = tiny_llava("clip", seed=0)
        data = ShapesCaptionDataset.for_llava(model.config, size=8, seed=1, text_only_every=3)
    else:
        model = tiny_qwen2_vl(seed=0)
        data = ShapesCaptionDataset.for_qwen2_vl(model.config, size=8, seed=1, text_only_every=3)
    samples = [data[i] for i in range(8)]
    assert len({len(s["input_ids"]) for s in samples}) > 1  # padding really happens
    assert any(s.get("pixel_values") is None for s in samples)  # text-only samples too
    split = split_collated(_collate(samples, side), adapter_for(model))
    for got, want in zip(split, samples):
        _same(got, {k: v for k, v in want.items() if v is not None})


def test_split_collated_negative_control_and_errors():
    model = tiny_llava("clip", seed=0)
    adapter = adapter_for(model)
    data = ShapesCaptionDataset.for_llava(model.config, size=8, seed=1, text_only_every=3)
    samples = [data[i] for i in range(6)]  # 4 with an image, 2 text only
    batch = _collate(samples)
    # without the attention mask the padding stays: the split no longer gives the samples back
    no_mask = {k: v for k, v in batch.items() if k != "attention_mask"}
    assert any(len(g["input_ids"]) != len(s["input_ids"]) for g, s in zip(split_collated(no_mask, adapter), samples))
    with pytest.raises(ValueError, match="pixel_values holds 3 images, but the input_ids hold 4"):
        split_collated({**batch, "pixel_values": batch["pixel_values"][:3]}, adapter)
    with pytest.raises(ValueError, match="image_sizes .* does not know how to split"):
        split_collated({**batch, "image_sizes": torch.ones(6, 2)}, adapter)
    with pytest.raises(ValueError, match="no 'labels'"):
        split_collated({k: v for k, v in batch.items() if k != "labels"}, adapter)


def test_sample_conversions_and_errors():
    lists = [{"input_ids": [1, 5, 6], "labels": np.array([1, 5, 6])}]
    (s,) = as_sample_list(lists)
    assert s["input_ids"].dtype == torch.long and s["labels"].dtype == torch.long and s["labels"].tolist() == [1, 5, 6]
    with pytest.raises(ValueError, match="got one dict .*a collated batch"):
        as_sample_list({"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="rows have keys images, messages: these are raw dataset rows.*"
                                         r"ds_hetero.hetero\(SFTTrainer\)"):
        as_sample_list([{"messages": [{"role": "user", "content": "hi"}], "images": []}])


def test_inline_section(tmp_path, monkeypatch):
    from ds_hetero.integrations.inline import ENV, with_inline_section

    section = {"placement": "colocated", "stages": {"vision": {"dp": 2}, "language": {"dp": 2}}}
    path = tmp_path / "hetero.yaml"
    path.write_text("hetero_parallel:\n  placement: colocated\n  stages:\n    vision: {dp: 2}\n    language: {dp: 2}\n")
    assert with_inline_section({"zero_optimization": {"stage": 3}}, {}) == {"zero_optimization": {"stage": 3}}
    merged = with_inline_section({"zero_optimization": {"stage": 3}}, {ENV: str(path)})
    assert merged["hetero_parallel"] == section
    with pytest.raises(HeteroConfigError, match="both the DeepSpeed config and DS_HETERO_PARALLEL"):
        with_inline_section({"hetero_parallel": section}, {ENV: str(path)})
    # the guard: with the variable set, a plain deepspeed.initialize refuses (before building anything)
    import deepspeed

    import ds_hetero  # noqa: F401  (installs the guard)

    monkeypatch.setenv(ENV, str(path))
    with pytest.raises(HeteroConfigError, match=r"DS_HETERO_PARALLEL is set.*ds_hetero.hetero\(SFTTrainer\)"):
        deepspeed.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 1})


def _trainer_stub(cls, **args):
    """An instance of `cls` without running Trainer.__init__: what loss_problems reads."""
    from types import SimpleNamespace

    t = cls.__new__(cls)
    t.args = SimpleNamespace(**{"label_smoothing_factor": 0.0, "loss_type": "nll", "padding_free": False,
                                "packing": False, **args})
    t.compute_loss_func, t.model = None, torch.nn.Linear(1, 1)
    return t


def test_loss_options_refused_by_name():
    from transformers import Seq2SeqTrainer, Trainer
    from trl import SFTTrainer

    import ds_hetero
    from ds_hetero.integrations.trainer.loss_options import loss_problems

    for base in (Trainer, Seq2SeqTrainer, SFTTrainer):
        assert loss_problems(_trainer_stub(ds_hetero.hetero(base))) == []
    T = ds_hetero.hetero(SFTTrainer)
    assert any('loss_type="dft"' in p for p in loss_problems(_trainer_stub(T, loss_type="dft")))
    assert any("label_smoothing_factor=0.1" in p for p in loss_problems(_trainer_stub(T, label_smoothing_factor=0.1)))
    t = _trainer_stub(T)
    t.compute_loss_func = lambda *a, **k: 0
    assert any("compute_loss_func" in p for p in loss_problems(t))

    class Custom(Seq2SeqTrainer):  # LLaMA-Factory-like: its own compute_loss
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    (problem,) = loss_problems(_trainer_stub(ds_hetero.hetero(Custom)))
    assert "Custom.compute_loss overrides the loss" in problem and "engine_loss=True" in problem
    assert loss_problems(_trainer_stub(ds_hetero.hetero(Custom, engine_loss=True))) == []

    class Mixed(ds_hetero.HeteroTrainerMixin, Custom):  # the mixin written in the bases
        pass

    assert "Custom.compute_loss" in loss_problems(_trainer_stub(Mixed))[0]


def test_subclass_optimizer_rebuilt_per_stage():
    from ds_hetero.integrations.trainer.loss_options import per_stage_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-2},
                             {"params": model[1].parameters(), "lr": 1e-3, "weight_decay": 0.0}], betas=(0.8, 0.9))
    factory = per_stage_optimizer(opt, model)
    model[1].weight = torch.nn.Parameter(model[1].weight.detach()[:1].clone())  # "sharded": new object, same name
    built = factory([model[1].weight, model[0].bias])
    assert type(built) is torch.optim.AdamW
    lrs = {g["lr"]: [tuple(p.shape) for p in g["params"]] for g in built.param_groups}
    assert lrs == {1e-2: [(3,)], 1e-3: [(1, 3)]}
    assert all(g["betas"] == (0.8, 0.9) for g in built.param_groups)
    with pytest.raises(HeteroConfigError, match="in no param group"):
        factory([torch.nn.Parameter(torch.zeros(1))])
