"""Per-shard loading without processes: slices, checkpoint names, buffers, ties, clear errors.

The slice arithmetic is checked against `shard_tensor` (the function that shards a fully built
model) for every tp rank of column, fused-qkv (stride 3), row and padded-vocabulary shards; the
whole-model load (one "stage" at tp 1) against the model that wrote the checkpoint, tensor for
tensor, for LLaVA and Qwen2-VL, sharded and single-file checkpoints, in the layout
`save_pretrained` writes and in the model's own layout.
"""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from ds_hetero.weights import WeightsError, load_stages, meta_model, open_weights
from ds_hetero.weights.shard_slices import shard_slices
from ds_hetero.tensor_parallel.layers import mark_sharded, shard_tensor
from ds_hetero.testing.parity import build_model

CPU = torch.device("cpu")


def _sharded_meta(full_shape, dim, stride, tp, padded_to=None):
    shape = list(full_shape)
    shape[dim] = (padded_to or full_shape[dim]) // tp
    p = torch.nn.Parameter(torch.empty(shape, device="meta"))
    return mark_sharded(p, dim, stride, full_shape[dim])


CASES = {  # name: (full shape, dim, stride, tp, padded length)
    "column": ((8, 6), 0, 1, 2, None),
    "fused qkv": ((12, 4), 0, 3, 2, None),
    "row": ((6, 8), 1, 1, 4, None),
    "padded vocab": ((10, 3), 0, 1, 4, 12),
}


@pytest.mark.parametrize("case", CASES)
def test_each_rank_reads_exactly_the_rows_shard_tensor_gives_it(tmp_path, case):
    shape, dim, stride, tp, padded = CASES[case]
    full = torch.randn(shape)
    save_file({"w": full}, tmp_path / "model.safetensors")
    from ds_hetero.weights.safetensors_files import read_into
    from ds_hetero.weights.materialize import _fill

    padded_full = full if padded is None else torch.cat([full, full.new_zeros(padded - shape[0], *shape[1:])])
    read = lambda name, out, runs, d: read_into(str(tmp_path / "model.safetensors"), name, out, runs, d)  # noqa: E731
    for rank in range(tp):
        like = _sharded_meta(shape, dim, stride, tp, padded)
        got, numel = _fill(read, "w", like, rank, tp, CPU)
        assert torch.equal(got, shard_tensor(padded_full, dim, rank, tp, stride)), (case, rank)
        pad_rows = (padded - shape[0]) if padded and rank == tp - 1 else 0  # the last rank holds the padding
        assert numel == like.numel() - pad_rows * shape[1], (case, rank, numel)
        # negative control: the neighbour's rows are not this rank's shard
        wrong, _ = _fill(read, "w", like, (rank + 1) % tp, tp, CPU)
        assert not torch.equal(wrong, got)


def test_slices_are_runs_then_padding():
    qkv = shard_slices(_sharded_meta((12, 4), 0, 3, 2), 1, 2)
    assert (qkv.dim, qkv.runs, qkv.padding) == (0, ((2, 4), (6, 8), (10, 12)), 0)
    vocab = shard_slices(_sharded_meta((10, 3), 0, 1, 4, 12), 3, 4)
    assert (vocab.runs, vocab.padding) == (((9, 10),), 2)
    assert shard_slices(torch.nn.Parameter(torch.empty(3, device="meta")), 0, 2) is None  # replicated


def _state(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _own_layout(model, directory):
    """A checkpoint in the model's own names (not the layout save_pretrained reverts to)."""
    os.makedirs(directory)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(directory, "model.safetensors"))
    model.config.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("layout", ["save_pretrained sharded", "save_pretrained single", "own names"])
def test_a_whole_model_loads_back_exactly(tmp_path, family, layout):
    model = build_model(family, seed=3)
    directory = str(tmp_path / "ckpt")
    if layout == "own names":
        _own_layout(model, directory)
    else:
        model.save_pretrained(directory, max_shard_size="200KB" if "sharded" in layout else "1GB")
        assert os.path.exists(os.path.join(directory, "model.safetensors.index.json")) == ("sharded" in layout)
    meta = meta_model(directory)
    assert all(t.is_meta for t in _state(meta).values())
    report = load_stages(meta, {"all": meta}, {"all": (0, 1)}, open_weights(meta, directory), CPU)
    want, got = _state(model), _state(meta)
    assert sorted(got) == sorted(want)
    for name, w in want.items():  # parameters and the recomputed non-persistent buffers
        assert got[name].device == CPU and got[name].dtype == w.dtype, name
        assert torch.equal(got[name], w), name
    assert report["all"].bytes_read == report["all"].bytes_full == sum(
        p.numel() * p.element_size() for p in model.parameters())


def test_tied_embeddings_load_once_and_stay_tied(tmp_path):
    from transformers import AutoModelForImageTextToText

    cfg = build_model("llava", seed=0).config
    cfg.tie_word_embeddings = True
    torch.manual_seed(5)
    model = AutoModelForImageTextToText.from_config(cfg)
    model.save_pretrained(tmp_path)
    meta = meta_model(str(tmp_path))
    load_stages(meta, {"all": meta}, {"all": (0, 1)}, open_weights(meta, str(tmp_path)), CPU)
    assert meta.lm_head.weight is meta.model.language_model.embed_tokens.weight
    assert torch.equal(meta.lm_head.weight, model.lm_head.weight)


def test_bad_weights_are_refused_by_name(tmp_path):
    model = build_model("llava", seed=0)
    with pytest.raises(WeightsError, match="meta device.*weights=DIR"):
        open_weights(meta_model(model.config), None)
    assert open_weights(model, None) is None  # a fully built model needs none
    with pytest.raises(WeightsError, match="not a directory"):
        open_weights(model, str(tmp_path / "nowhere"))
    with pytest.raises(WeightsError, match="neither model.safetensors.index.json nor model.safetensors"):
        open_weights(model, str(tmp_path))
    directory = str(tmp_path / "ckpt")
    model.save_pretrained(directory)
    # another config: a tensor of the wrong shape
    other = build_model("llava", seed=0, text_hidden=32)
    with pytest.raises(WeightsError, match=r"has shape \[.*\] but the model's"):
        open_weights(meta_model(other.config), directory)
    # a tensor missing from the index
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="200KB")
    index_path = tmp_path / "sharded" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].pop("multi_modal_projector.linear_1.weight")
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="no tensor for 'model.multi_modal_projector.linear_1.weight'"):
        open_weights(meta_model(model.config), str(tmp_path / "sharded"))


def test_a_buffer_transformers_does_not_recompute_is_an_error_not_garbage(tmp_path):
    model = build_model("llava", seed=0)
    model.save_pretrained(tmp_path)
    meta = meta_model(str(tmp_path))
    meta.model.multi_modal_projector.register_buffer("scale", torch.empty(3, device="meta"), persistent=False)
    with pytest.raises(WeightsError, match="'model.multi_modal_projector.scale'.*does not recompute"):
        load_stages(meta, {"all": meta}, {"all": (0, 1)}, open_weights(meta, str(tmp_path)), CPU)
