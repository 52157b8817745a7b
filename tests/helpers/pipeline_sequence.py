"""Shared by the sequence-sharded pipeline tests: a pipelined language stage with context
parallelism or sequence parallelism, and a pipelined one with ZeRO 3, trained against the
single-process Hugging Face reference (ds_hetero.testing.parity), and their negative controls."""

from tests.helpers.pipeline_parity import evaluate_first, run_layouts

CP_CONTROL = "pp2cp2 labels shifted inside the shard (negative control) sgd"
ZERO3_CONTROL = "pp2dp2 zero3 back-to-back backwards not counted (negative control) sgd"


def unshifted_shard_labels(engine, batches):
    """Negative control: the last pipeline stage shifts the labels inside its cp shard instead of
    taking the ones shifted on the full sequence, so the last token of every shard but the last
    loses its target and the losses differ from the reference's."""
    from ds_hetero.schedule import one_f_one_b as pipeline

    real = pipeline.token_loss_sum

    def wrong(logits, labels, head=None, shifted=False):
        return real(logits, labels, head, shifted=False) if shifted else real(logits, labels, head, shifted)

    pipeline.token_loss_sum = wrong
    return {}


def sequence_layouts(rank, world_size):
    """Language pp2 cp2 (vision dp4) with eval_batch, pp2 tp2 with sequence parallelism and
    eval_batch, Qwen2-VL pp2 cp2 (M-RoPE positions, variable image tokens, text-only samples), and
    the negative control (one launch)."""
    from ds_hetero.schedule import one_f_one_b as pipeline

    real = pipeline.token_loss_sum
    try:
        return run_layouts(rank, world_size, {
            "vision dp4 + language pp2cp2 zero1 adamw": dict(
                layout={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 1, "pp": 2}}, zero_stage=1,
                inspect=evaluate_first),
            "vision dp4 + language pp2tp2 sequence_parallel zero2 sgd": dict(
                layout={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 1, "pp": 2, "sequence_parallel": True}},
                zero_stage=2, optimizer="sgd", inspect=evaluate_first),
            "qwen2-vl vision dp4 + language pp2cp2 zero2 adamw": dict(
                family="qwen2_vl", layout={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 1, "pp": 2}},
                zero_stage=2),
            CP_CONTROL: dict(layout={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 1, "pp": 2}}, zero_stage=1,
                             optimizer="sgd", steps=2, inspect=unshifted_shard_labels),
        })
    finally:
        pipeline.token_loss_sum = real


def uncounted_backwards(engine, batches):
    """Negative control: ZeRO 3 counts a micro-step only at the next forward (DeepSpeed's own
    behaviour), so back-to-back backwards copy over each other's gradients."""
    from ds_hetero.schedule import pipeline

    pipeline.count_backward = lambda engine: False
    return {}


def zero3_layouts(rank, world_size):
    """ZeRO 3 on every stage with a pipelined language stage: pp2 dp2 (vision dp4: its four passes'
    backwards run back to back) with eval_batch, pp4 (1F1B's cool-down runs back-to-back
    backwards), pp2 cp2 (with the dp x cp partitioning of context_parallel/zero3.py), first_stage
    with ZeRO 3 on the language stage (the encoder on pipeline stage 0's ranks only, ZeRO 1: see
    validation.py), and the negative control (one launch).

    DeepSpeed numbers ZeRO-3 parameters and modules with process-wide counters (`Init.param_id`,
    the default argument `count` of `DeepSpeedZeRoOffload._register_deepspeed_module`) and its
    trace check compares those numbers across ranks; after a pipelined run the ranks of different
    pipeline stages have numbered different counts (their chunks differ), so each run here starts
    the counts afresh, as a new process would."""
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.partition_parameters import Init

    from ds_hetero.schedule import pipeline

    runs = {
        "vision dp4 + language pp2dp2 zero3 adamw": dict(
            layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=3, inspect=evaluate_first),
        "vision tp2dp2 + language pp4 zero3 sgd": dict(
            layout={"vision": {"tp": 2, "dp": 2}, "language": {"dp": 1, "pp": 4}}, zero_stage=3, optimizer="sgd"),
        "vision dp4 + language pp2cp2 zero3 adamw": dict(
            layout={"vision": {"dp": 4}, "language": {"cp": 2, "dp": 1, "pp": 2}}, zero_stage=3),
        "first_stage vision tp2 zero1 + language pp2tp2 zero3 adamw": dict(
            layout={"vision": {"tp": 2, "dp": 1, "zero_stage": 1}, "language": {"tp": 2, "dp": 1, "pp": 2}},
            zero_stage=3, placement="first_stage"),
        ZERO3_CONTROL: dict(layout={"vision": {"dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=3,
                            optimizer="sgd", steps=2, inspect=uncounted_backwards),
    }
    real = pipeline.count_backward
    out = {}
    for name, kw in runs.items():
        Init.param_id = 0
        DeepSpeedZeRoOffload._register_deepspeed_module.__defaults__[0][0] = 0
        try:
            out.update(run_layouts(rank, world_size, {name: kw}))
        finally:
            pipeline.count_backward = real
    return out


RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3


def check_parity(results, control: str, steps: int = 5) -> set[str]:
    """Every run but `control` matches the reference (losses 1e-5 relative, of the Hugging Face
    model's own loss too; grad norms 1e-4; every weight tensor 1e-5 relative, clipping active on
    every step; boundary bytes at their bound; eval_batch before training the model's first loss);
    the control differs on every rank. Returns the runs whose eval_batch was checked."""
    evaluated = set()
    for rank, per_rank in enumerate(results):
        assert control in per_rank, (rank, "the negative control did not run")
        for name, r in per_rank.items():
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name, "no weight tensor was compared")
            if name == control:
                assert err > 100 * RTOL and abs_err > 100 * ATOL, (rank, name, r["weight_err"])
                continue
            assert len(r["losses"]) == len(r["ref_losses"]) == len(r["hf_losses"]) == steps, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active on every step
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)
            if "eval_loss" in r:
                assert abs(r["eval_loss"] - r["hf_losses"][0]) <= RTOL * abs(r["hf_losses"][0]), (rank, name, r)
                evaluated.add(name)
    return evaluated
