"""Packed Qwen3.5 and Qwen3.5-MoE against the single-process Hugging Face model on the UNPACKED batch.

`train_packed_qwen3_5(rank, world_size, family, layout, ...)`: the dense family through
tests/helpers/family_parity.py `train_family`, the MoE through tests/helpers/moe_parity.py `train_moe`,
with `language_batching` "packed"; the reference is the model's own `model(**batch).loss` on the padded
batch (each sample alone in its row: the linear-attention state starts at zero in every sample).
It also reports what the packed run did, seen by a hook on one Gated DeltaNet layer of the language
stage: the most samples one row held (packing happened), and how many of the stage's Gated DeltaNet
layers restart per sample.

`stock=True` is the negative control: the Gated DeltaNet layers keep their stock forward, so the
whole packed row runs through each of them and its convolution window and recurrent state carry from
one sample into the next; everything else (per-sample attention, positions, labels) is as packed.
"""

from contextlib import contextmanager, nullcontext


@contextmanager
def stock_gated_deltanet():
    """Packed runs in this process leave the Gated DeltaNet layers stock (the adapters' hook a no-op)."""
    from ds_hetero.families.qwen3_5.adapter import Qwen3_5Adapter

    own = Qwen3_5Adapter.separate_packed_samples
    Qwen3_5Adapter.separate_packed_samples = lambda self, decoder: None
    try:
        yield
    finally:  # later cases in the same launch pack right
        Qwen3_5Adapter.separate_packed_samples = own


def observe_deltanet(engine, **counted):
    """What a run did, seen by a hook on the first Gated DeltaNet layer: {"layers", "most_in_a_row": the
    most samples a packed row held, per call, and per `counted` name the layers its predicate holds for}."""
    from ds_hetero.families.qwen3_5.packed_deltanet import is_gated_deltanet

    language = engine.stages.language
    layers = [m for m in language.module.modules() if is_gated_deltanet(m)] if language.held else []
    seen = {"most_in_a_row": [], "layers": len(layers),
            **{name: sum(map(predicate, layers)) for name, predicate in counted.items()}}

    def record(_, args, kwargs):
        segments = kwargs.get("packed_segments")
        if segments is not None:
            seen["most_in_a_row"].append(max(sum(1 for n in row if n) for row in segments))

    if layers:
        layers[0].register_forward_pre_hook(record, with_kwargs=True)
    return seen


def _observe(engine):
    """{"most_in_a_row", "restarting": layers restarting per packed sample, "layers"}."""
    from ds_hetero.families.qwen3_5.packed_deltanet import restarts_per_sample

    return observe_deltanet(engine, restarting=restarts_per_sample)


def check_moe_run(rank, r, rtol, atol):
    """A Qwen3.5-MoE run (tests/helpers/moe_parity.py train_moe) at the bar: 5 steps, losses, norms and
    aux losses against the reference, clipping active, every weight (experts gathered) compared."""
    from tests.helpers.moe_parity import CLIP

    assert len(r["losses"]) == 5
    for key, tol in (("losses", rtol), ("norms", 1e-4), ("aux", rtol)):
        for got, want in zip(r[key], r[f"ref_{key}"], strict=True):
            assert abs(got - want) <= tol * abs(want), (rank, key, r[key], r[f"ref_{key}"])
    assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
    err, where, abs_err, compared = r["weight_err"]
    assert compared == r["n_params"], (compared, r["n_params"])  # every weight, experts gathered
    assert err <= rtol and abs_err <= atol, (rank, err, where, abs_err)


def train_packed_qwen3_5(rank, world_size, family, layout, stock=False, **kw):
    from tests.helpers.family_parity import train_family
    from tests.helpers.moe_parity import train_moe

    hetero = {"language_batching": "packed", **kw.pop("hetero", {})}
    with stock_gated_deltanet() if stock else nullcontext():
        if family == "qwen3_5_moe":
            return train_moe(rank, world_size, layout, family=family, hetero=hetero, inspect=_observe, **kw)
        return train_family(rank, world_size, family, layout, hetero=hetero, inspect=_observe, **kw)
