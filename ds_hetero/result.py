"""What one optimizer step reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepResult:
    """One `HeteroEngine.train_batch` call.

    loss            global-batch mean over label tokens (identical on every rank)
    grad_norm       norm of all stages' gradients together, before clipping
    num_tokens      label tokens in the global batch
    num_samples     samples in the global batch
    step_time       wall-clock seconds of the whole step on this rank
    stage_time      seconds per stage and phase on this rank, e.g. {"vision": {"forward": .., "backward": ..}}
                    ("backward" of vision includes the boundary's backward exchange)
    boundary_bytes  bytes this rank sent over the network at the boundary (forward + backward)
    boundary_bytes_lower_bound  the forward lower bound, all ranks together (see BoundaryPlan)
    boundary_bytes_total        bytes all ranks sent in the forward exchanges
    boundary_bytes_backward     the part of boundary_bytes this rank sent in backward exchanges (0 for
                                an encoder that does not train: it has no backward exchange)
    boundary_bytes_backward_lower_bound  the backward exchanges' lower bound, all ranks together: every row
                                gradient an encoder replica needs and holds no copy of (0 on a rank that
                                runs no backward exchange, and for an encoder that does not train)
    busy_time       seconds this rank spent in forward, backward and optimizer work
    bubble_fraction 1 - busy_time / (step_time - data_wait): the share of the step this rank waited on
                    other ranks (the data wait is counted apart)
    data_wait       seconds this step waited for this rank's share of the training data (the loader's
                    reader: 0 when samples are passed in; with data workers, only what they had not read
                    ahead; docs/real-data.md)
    aux_loss        a mixture-of-experts language stage's router load-balancing loss (None without
                    one), as the Hugging Face model computes it (`load_balancing_loss_func`): per
                    language micro-batch over all of that micro-batch's tokens (every dp x cp rank's
                    share), then the mean over the micro-batches; with one micro-batch exactly the
                    single process's aux loss on the global batch. `loss` includes
                    `router_aux_loss_coef * aux_loss`; its lm part stays the mean over the global
                    batch's label tokens (docs/expert-parallel.md)
    language_tokens the language stage's tokens of the step, from its plan (the same on every rank):
                    `real`, `computed` (every dp rank's rows padded, all ranks together) and
                    `max_mean` (the slowest language dp rank's cost over the mean, worst micro-batch),
                    `step_max_mean` (the slowest ranks' summed over micro-batches over the means'); docs/packing.md
    throughput      the step's FLOPs and rates (throughput/meter.py; empty for a model the planner cannot
                    read): `flops/<scope>`, `tflops_per_device/<scope>`, `mfu/<scope>` for scope `model`
                    (every stage) and `language`, over the job's devices; `tflops_per_device/stage/<name>`,
                    `mfu/stage/<name>` over each stage's own devices; this rank's step time (docs/throughput.md)
    """

    loss: float
    grad_norm: float
    num_tokens: int
    num_samples: int
    step_time: float
    stage_time: dict[str, dict[str, float]] = field(default_factory=dict)
    boundary_bytes: int = 0
    boundary_bytes_total: int = 0
    boundary_bytes_lower_bound: int = 0
    boundary_bytes_backward: int = 0
    boundary_bytes_backward_lower_bound: int = 0
    busy_time: float = 0.0
    bubble_fraction: float = 0.0
    skipped: bool = False
    aux_loss: float | None = None
    language_tokens: dict[str, float] = field(default_factory=dict)
    data_wait: float = 0.0
    throughput: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)
