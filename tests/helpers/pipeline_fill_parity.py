"""Shared by the fill-and-drain parity test: colocated encoders whose work runs inside a pipelined
language stage's 1F1B (schedule/fill_drain.py), against the single-process Hugging Face reference,
and a negative control that misroutes a pass's rows."""

from tests.helpers.pipeline_parity import FOUR_LAYERS, run_layouts


def reverse_rows_of_each_pass(engine, batches):
    """Negative control: the rows of an encoder pass that feeds several language micro-batches
    arrive for them in reverse order (micro-batch 1's image rows in micro-batch 0 and back).
    Every sample holds the same number of image rows here, so shapes still match and only the
    losses can tell."""
    from ds_hetero.schedule import pipeline

    base = pipeline.EncodersInPipeline

    class Reversed(base):
        def _run(self, w):
            super()._run(w)
            kind, name, k = w
            if kind == "rows" and self.first:
                feeds = list(self.plan.encoder_pass(name, k).feeds)
                pieces = [self.arrived[m][name] for m in feeds]
                for m, piece in zip(feeds, reversed(pieces)):
                    self.arrived[m][name] = piece

    pipeline.EncodersInPipeline = Reversed
    return {}


def suite(rank, world_size):
    from ds_hetero.schedule import pipeline

    base = pipeline.EncodersInPipeline
    try:
        return run_layouts(rank, world_size, {
            "vision dp4 two passes + language pp2dp2 zero1 adamw": dict(
                layout={"vision": {"dp": 4, "micro_batches": 2}, "language": {"dp": 2, "pp": 2}}, zero_stage=1),
            "omni vision dp4 + audio tp2dp2 one pass + language pp2dp2 zero1 sgd": dict(
                family="omni", layout={"vision": {"dp": 4}, "audio": {"tp": 2, "dp": 2, "micro_batches": 1},
                                       "language": {"dp": 2, "pp": 2}},
                zero_stage=1, optimizer="sgd", model_kw={}),
            "mixed omni vision dp2 on language pp2 [0,1] + audio dp2 [2,3] zero1 adamw": dict(
                family="omni", placement="mixed", zero_stage=1, model_kw={},
                layout={"vision": {"dp": 2, "ranks": [0, 1]}, "audio": {"dp": 2, "ranks": [2, 3]},
                        "language": {"dp": 1, "pp": 2, "ranks": [0, 1]}}),
            "rows of a pass reversed (negative control)": dict(
                layout={"vision": {"dp": 4, "micro_batches": 2}, "language": {"dp": 2, "pp": 2}}, zero_stage=1,
                steps=2, inspect=reverse_rows_of_each_pass, model_kw=FOUR_LAYERS),
        })
    finally:
        pipeline.EncodersInPipeline = base
