"""What TRL's and ms-swift's `compute_loss` log besides the loss, and the Trainer's `total_flos`, under ds_hetero.

The engine's loss pass replaces `compute_loss`, so whatever a framework counted there would vanish.
The token counts come from the engine's own logits (token_metrics.py) and reach each framework
where its `log` reads them:

    TRL's SFTTrainer   `_metrics["train"]` lists (mean_token_accuracy, entropy, num_tokens), which
                       its `log` averages into the logs
    ms-swift           `token_acc` (its default `acc_strategy="token"`: label tokens whose argmax is
                       the label, over every rank's label tokens), put into the logs before its
                       SwiftMixin.log adds its own `custom_metrics` (which then hold no token_acc)

`total_flos`: the Trainer counts `6 x non-embedding parameters x input_ids.numel()` per rank
(`Trainer.floating_point_ops`) on each rank's padded per-device batch, summed over ranks at log
time. Under ds_hetero the Trainer's `inputs` are dataset indices (no input_ids), so the count is
made in `training_step` from the global batch's tokens, each rank adding its 1/world share:
the same formula on the unpadded tokens (stock counts the padding of each per-device batch too).
"""

from __future__ import annotations

from typing import Any


def framework(trainer) -> str | None:
    """"trl" (SFTTrainer's token counters), "swift" (ms-swift's SwiftMixin), or None."""
    if hasattr(trainer, "_total_train_tokens") and hasattr(trainer, "_metrics"):
        return "trl"
    if hasattr(trainer, "custom_metrics") and hasattr(trainer.args, "acc_strategy"):
        return "swift"
    return None


def publish(trainer, tokens, logs: dict[str, float]) -> None:
    """Token metrics since the last log (collective: every rank calls it) into the framework's log path."""
    kind = framework(trainer)
    values = tokens.reduce()
    if kind == "trl":
        metrics = trainer._metrics["train"]
        metrics.clear()
        metrics.update({k: [v] for k, v in values.items()})
        metrics["num_tokens"] = [trainer._total_train_tokens]
    elif kind == "swift" and "mean_token_accuracy" in values and trainer.args.acc_strategy == "token":
        logs["token_acc"] = values["mean_token_accuracy"]  # "seq" (whole-sequence accuracy) is not counted


def flops_per_token(model) -> float:
    """The Trainer's `floating_point_ops` factor, taken from the whole model before any stage is sharded."""
    if not hasattr(model, "num_parameters"):
        return 0.0
    return 6.0 * model.num_parameters(exclude_embeddings=True)


def flops_share(per_token: float, samples: list[dict[str, Any]], world_size: int) -> float:
    """This rank's share of the global batch's training flops (the Trainer sums `current_flos` over ranks)."""
    tokens = sum(int(s["input_ids"].numel()) for s in samples)
    return per_token * tokens / world_size
