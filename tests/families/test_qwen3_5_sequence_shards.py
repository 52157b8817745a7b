"""Qwen3.5 and Qwen3.5-MoE on sequence shards (language cp, sequence parallelism) against the single-process
Hugging Face model on the unpacked batch, with the model's own loss.

The Gated DeltaNet layers split their heads over cp (families/qwen3_5/sequence_shards.py: an all-to-all
to whole sequences of value heads / cp, the convolution and the delta rule there, an all-to-all back);
the gated full-attention layers run Ulysses over cp (context_parallel/attention.py).

One 4-rank launch:
- layer level (fp64): the first Gated DeltaNet layer of the tiny model on cp 2, cp 4 and tp 2 x cp 2
  (its 2 key heads repeated so cp divides them), padded and packed (an empty sample, a padding segment,
  samples across the delta rule's 64-position chunks): each chunk's output and input gradient and every
  parameter gradient (summed over cp, gathered over tp) equal the stock layer's on the whole batch
  within 1e-12; the exchange pair (`sequence_to_heads`, `heads_to_sequence`) at cp 2 and 4: inverse of
  each other and each the other's adjoint (<A x, y> = <x, A^T y>, the backward of each the other);
- training, fp32, 5 steps, AdamW, clipping active (losses 1e-5 relative, grad norms 1e-4, every weight
  1e-5): Qwen3.5 vision dp4 + language cp2 dp2 (ZeRO 1), language tp2 cp2 with sequence parallelism
  (ZeRO 2), language tp2 dp2 with sequence parallelism alone, language pp2 cp2 cut [1, 3] (4 micro-batches),
  packed language cp2 dp2 (2 micro-batches, rows of several samples) and packed tp2 cp2 with sequence
  parallelism, and Qwen3.5-MoE language cp2 dp2 ep2 (its aux loss too);
- negative control: cp2 dp2 with the stock Gated DeltaNet layers (each cp rank runs the convolution and
  the delta rule over its own chunk only: the state restarts at every chunk), 3 steps: misses the bar.
Without processes: `ds-hetero validate` and `initialize` agree, on every layout above (valid) and on
cp 8 (tp x cp not dividing the 4 linear-attention value heads: refused by both, naming the cp field).
"""

import json
from contextlib import contextmanager, nullcontext

import pytest

from tests.helpers.family_checks import CLIP, check_family_parity
from tests.helpers.qwen3_5_cp_layer import deltanet_on_shards, exchange_adjoint

RTOL, ATOL = 1e-5, 1e-6
V = {"dp": 4}
CP2 = "qwen3.5 vision dp4 + language cp2 dp2 zero1 adamw"
TP2CP2SP = "qwen3.5 vision dp4 + language tp2 cp2 sequence parallel zero2 adamw"
SP = "qwen3.5 vision dp4 + language tp2 dp2 sequence parallel zero1 adamw"
PACKED = "qwen3.5 packed vision dp4 + language cp2 dp2, 2 micro-batches, zero1 adamw"
PP = "qwen3.5 vision dp4 + language pp2 cp2 [1, 3], 4 micro-batches, zero1 adamw"
PACKED_SP = "qwen3.5 packed vision dp4 + language tp2 cp2 sequence parallel zero1 adamw"
MOE = "qwen3.5-moe vision dp4 + language cp2 dp2 ep2 zero1 adamw"
CONTROL = "control: qwen3.5 language cp2 dp2, each cp rank's chunk alone"
TRAIN = {
    CP2: dict(layout={"vision": V, "language": {"tp": 1, "cp": 2, "dp": 2}}, zero_stage=1),
    TP2CP2SP: dict(layout={"vision": V, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
                   zero_stage=2),
    SP: dict(layout={"vision": V, "language": {"tp": 2, "dp": 2, "sequence_parallel": True}}, zero_stage=1),
    PACKED: dict(layout={"vision": V, "language": {"tp": 1, "cp": 2, "dp": 2}}, zero_stage=1,
                 hetero={"language_batching": "packed"}),
    # pipelined: the first chunk one Gated DeltaNet layer, the second two more and the full-attention layer
    PP: dict(layout={"vision": V, "language": {"tp": 1, "cp": 2, "dp": 1, "pp": 2, "pp_layers": [1, 3]}},
             zero_stage=1, micro_batches=4),
    PACKED_SP: dict(layout={"vision": V, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
                    zero_stage=1, hetero={"language_batching": "packed"}),
}
# the Gated DeltaNet layers each rank holds: all 3, or 1 | 2 over the pipeline stages (ranks: cp, then pp)
HELD = {name: [1, 1, 2, 2] if name == PP else [3] * 4 for name in TRAIN}
LAYERS = {
    "layer cp2": dict(tp=1, cp=2), "layer cp4": dict(tp=1, cp=4), "layer tp2 cp2": dict(tp=2, cp=2),
    "layer cp2 packed": dict(tp=1, cp=2, packed=True), "layer tp2 cp2 packed": dict(tp=2, cp=2, packed=True),
    "layer control: each chunk alone": dict(tp=1, cp=2, local=True),
}


def _observe(engine):
    """{"on_shards": layers that split their heads over cp, "layers", "most_in_a_row"}."""
    from ds_hetero.families.qwen3_5.sequence_shards import on_sequence_shards
    from tests.helpers.qwen3_5_packing_parity import observe_deltanet

    return observe_deltanet(engine, on_shards=on_sequence_shards)


@contextmanager
def chunks_alone():
    """The negative control: the Gated DeltaNet layers keep their stock forward under cp, so each rank
    runs them over its own chunk of the sequence from a zero state."""
    from ds_hetero.families.qwen3_5.adapter import Qwen3_5Adapter

    own = Qwen3_5Adapter.split_linear_attention
    Qwen3_5Adapter.split_linear_attention = lambda self, decoder, group: None
    try:
        yield
    finally:
        Qwen3_5Adapter.split_linear_attention = own


def _train(rank, world_size, control=False, **kw):
    from tests.helpers.family_parity import train_family

    with chunks_alone() if control else nullcontext():
        return train_family(rank, world_size, "qwen3_5", clip=CLIP, inspect=_observe, **kw)


def _train_moe(rank, world_size, **kw):
    from tests.helpers.moe_parity import train_moe

    return train_moe(rank, world_size, family="qwen3_5_moe", inspect=_observe, **kw)


@pytest.fixture(scope="module")
def runs():  # one 4-rank launch for every distributed test below
    from ds_hetero.testing.cases import launch_cases

    cases = {"exchange adjoint": (exchange_adjoint, {})}
    cases.update({name: (deltanet_on_shards, kw) for name, kw in LAYERS.items()})
    cases.update({name: (_train, dict(kw, steps=5)) for name, kw in TRAIN.items()})
    cases[MOE] = (_train_moe, dict(layout={"vision": V, "language": {"tp": 1, "cp": 2, "dp": 2, "ep": 2}},
                                   zero_stage=1, steps=5, micro_batches=1))
    cases[CONTROL] = (_train, dict(TRAIN[CP2], steps=3, control=True))
    return launch_cases(cases, world_size=4, timeout=1800)


@pytest.mark.distributed
def test_exchange_pair_is_its_own_inverse_and_adjoint(runs):
    for r in runs["exchange adjoint"]:
        for cp, d in r.items():
            assert d["adjoint"] < 1e-12 and d["inverse"] == 0, (cp, d)
            assert d["backward_of_A"] == 0 and d["backward_of_AT"] == 0, (cp, d)


@pytest.mark.distributed
@pytest.mark.parametrize("name", [n for n in LAYERS if "control" not in n])
def test_gated_deltanet_on_shards_equals_the_whole_layer(runs, name):
    for r in runs[name]:
        assert r["out"] < 1e-12 and r["input_grad"] < 1e-12, (name, r)
        assert max(r["grads"].values()) < 1e-12, (name, r["grads"])


@pytest.mark.distributed
def test_gated_deltanet_on_each_chunk_alone_differs(runs):
    for r in runs["layer control: each chunk alone"]:
        assert r["input_grad"] > 1e-2 and max(r["grads"].values()) > 1e-2, r


@pytest.mark.distributed
def test_qwen3_5_on_sequence_shards_matches_the_single_process_reference(runs):
    for name in TRAIN:
        cp = TRAIN[name]["layout"]["language"].get("cp", 1)
        for r, held in zip(runs[name], HELD[name], strict=True):
            assert r["layers"] == held and r["on_shards"] == (held if cp > 1 else 0), (name, r)
    for r in runs[PACKED] + runs[PACKED_SP]:
        assert r["most_in_a_row"] and max(r["most_in_a_row"]) >= 2, r["most_in_a_row"]
    for name in TRAIN:
        print(name, distance(runs[name][0]))  # the figures of docs/tensor-and-context-parallel.md (pytest -s)
    check_family_parity([{name: runs[name][rank] for name in TRAIN} for rank in range(4)])


@pytest.mark.distributed
def test_qwen3_5_moe_on_sequence_shards_matches_the_single_process_reference(runs):
    from tests.helpers.qwen3_5_packing_parity import check_moe_run

    print(MOE, distance(runs[MOE][0]))
    for rank, r in enumerate(runs[MOE]):
        assert r["layers"] == 3 and r["on_shards"] == 3, r
        check_moe_run(rank, r, RTOL, ATOL)


def distance(r) -> dict:
    """How far a run ends from the reference: the worst relative loss, norm and weight errors."""
    return {"loss": max(abs(g - w) / abs(w) for g, w in zip(r["losses"], r["ref_losses"])),
            "norm": max(abs(g - w) / abs(w) for g, w in zip(r["norms"], r["ref_norms"])),
            "weight": r["weight_err"][0]}


@pytest.mark.distributed
def test_each_cp_rank_alone_misses_the_bar(runs):
    print(CONTROL, distance(runs[CONTROL][0]))
    for r in runs[CONTROL]:
        assert r["on_shards"] == 0, r
        d = distance(r)
        assert d["loss"] > 10 * RTOL and d["weight"] > 100 * RTOL, d


# ------------------------------------------------------------------ validate agrees with initialize
BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
CP8 = {"micro_batches": 1, "stages": {"vision": {"dp": 8}, "language": {"cp": 8, "dp": 1}}}


def _validate(tmp_path, section, capsys, world):
    from ds_hetero.cli import main

    path = tmp_path / "c.json"
    path.write_text(json.dumps({**BASE, "hetero_parallel": section}))
    code = main(["validate", str(path), "--world-size", str(world), "--model", "tiny-qwen3.5"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", list(TRAIN))
def test_validate_accepts_every_layout_trained_here(name, tmp_path, capsys):
    section = {"micro_batches": 2, "stages": TRAIN[name]["layout"], **TRAIN[name].get("hetero", {})}
    code, err = _validate(tmp_path, section, capsys, 4)
    assert code == 0, (name, err)


def test_validate_and_initialize_refuse_a_cp_that_splits_a_value_head(tmp_path, capsys, monkeypatch):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.errors import HeteroConfigError
    from ds_hetero.toy import tiny_qwen3_5

    field = "hetero_parallel.stages.language.cp"
    code, err = _validate(tmp_path, CP8, capsys, 8)
    assert code == 1 and f"'{field}'" in err and "linear-attention value heads" in err, err
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(HeteroConfigError) as info:
        ds_hetero.initialize(tiny_qwen3_5(), {**BASE, "hetero_parallel": CP8})
    assert info.value.field == field and "linear-attention value heads" in str(info.value), str(info.value)
    assert not dist.is_initialized()  # refused before any process group


# ------------------------------------------------------------------ one process: the forward is the layer's
def test_forward_on_one_shard_is_the_stock_forward_bit_for_bit():
    """At cp 1 (no group) the sharded forward is the Hugging Face layer's forward, cut where the exchanges
    go: equal to it bit for bit, padded (with the layer's 2-D padding mask) and packed (equal to the
    segmented forward of packed_deltanet.py); the MoE family's layer too."""
    import torch

    from ds_hetero.families.qwen3_5.packed_deltanet import segmented_forward
    from ds_hetero.families.qwen3_5.sequence_shards import sharded_forward
    from ds_hetero.toy import tiny_qwen3_5, tiny_qwen3_5_moe

    for model in (tiny_qwen3_5(seed=3), tiny_qwen3_5_moe(seed=3)):
        layer = model.model.language_model.layers[0].linear_attn.double()
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(2, 70, layer.hidden_size, generator=gen, dtype=torch.float64)
        mask = torch.ones(2, 70, dtype=torch.long)
        mask[1, -5:] = 0
        assert torch.equal(sharded_forward(layer, x, attention_mask=mask),
                           type(layer).forward(layer, x, attention_mask=mask))
        segments = [[30, 0, 40], [10, 50, 10]]
        assert torch.equal(sharded_forward(layer, x, packed_segments=segments),
                           segmented_forward(layer, x, packed_segments=segments))
