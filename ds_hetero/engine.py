"""HeteroEngine: one DeepSpeed engine per stage held by this rank, stepped as one model.

    engine = ds_hetero.initialize(model, "ds_config.json")
    result = engine.train_batch(samples)        # one optimizer step over the global batch

Set-up, in an order every rank follows identically (group creation and engine creation are
collective): validate the config (errors before any collective) -> process groups of every
stage -> shard each stage over its tp group -> cut the model into stage modules -> one
`deepspeed.initialize` per stage this rank holds, each with its own StageMPU and batch keys ->
the boundary communicator.
"""

from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from .data import agreement as batch_agreement
from .stages import clipping
from .config import HeteroConfig
from .topology.groups import build_groups
from .data.loader import GlobalBatchLoader
from .data.samples import as_sample_list
from .weights import load_stages
from .loss import label_token_count
from .models import adapter_for
from .topology.mpu import StageMPU, stage_context
from .result import StepResult
from .schedule import ColocatedSchedule, DisaggregatedSchedule
from .timeline import Timeline, bubble_fraction





class HeteroEngine:
    """Trains a Hugging Face multimodal model with a per-stage parallel layout.

    optimizer   optional factory `params -> torch.optim.Optimizer` used for every stage (as
                `deepspeed.initialize(optimizer=callable)`); otherwise the DeepSpeed config's
                "optimizer" section builds each stage's optimizer
    seed        order of the training data (the same on every rank)

    The process groups wait at most `hetero_parallel.timeout_s` (default 300 s) in a collective:
    a dead or stuck peer makes every other rank raise instead of hanging forever.
    In disaggregated placement a rank holds only its own stage: the other stage's modules of
    `model` are moved to the meta device (their memory is freed).
    weights     (of `initialize`) a Hugging Face safetensors checkpoint directory: `model` may then be
                built on the meta device (`ds_hetero.meta_model(DIR)`), and each rank reads and
                allocates only its own stages' tp shards (ds_hetero/weights/); `load_report` says
                what it read
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: str | os.PathLike | Mapping[str, Any],
        training_data: Any = None,
        collate_fn: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
        *,
        optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
        seed: int = 0,
        adapter=None,
        checkpoint=None,
    ):
        import deepspeed

        from .tensor_parallel import VocabParallelLMHead

        if not isinstance(config, HeteroConfig):
            raise TypeError("HeteroEngine takes a parsed HeteroConfig: build the engine with "
                            "ds_hetero.initialize(model, config), which reads, plans and checks the config")
        self.adapter = adapter if adapter is not None else adapter_for(model)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.config = cfg = config
        self.model = model

        self.groups = build_groups(cfg.stages, self.rank, timeout=timedelta(seconds=cfg.timeout_s))
        self.coords = {name: layout.coord(self.rank) for name, layout in cfg.stages.items() if layout.contains(self.rank)}
        self.adapter.shard(self.groups, cfg)  # per-stage tensor parallelism (checks first, then shards)
        modules = self.adapter.split()
        self.load_report = None if checkpoint is None else load_stages(
            model, {n: modules[n] for n in self.coords}, {n: (c.tp, cfg.stages[n].tp) for n, c in self.coords.items()},
            checkpoint)
        for name, module in modules.items():
            if name not in self.coords:  # disaggregated: another rank set holds this stage
                module.to("meta")
        self.mpus: dict[str, StageMPU] = {}
        self.engines: dict[str, Any] = {}
        for name in cfg.stage_names:  # same order on every rank: initialize is collective
            if name not in self.coords:
                continue
            mpu = StageMPU(self.groups[name])
            module = modules[name]
            params = (module.trainable_parameters() if hasattr(module, "trainable_parameters")
                      else [p for p in module.parameters() if p.requires_grad])
            with stage_context(mpu):
                engine, *_ = deepspeed.initialize(
                    model=module, model_parameters=params,
                    optimizer=optimizer, mpu=mpu, config=cfg.stage_ds_config(name),
                )
            clipping.check_supported(engine, name)
            self.mpus[name], self.engines[name] = mpu, engine
        head = modules["language"].lm_head
        self.lm_head = head if isinstance(head, VocabParallelLMHead) else None
        any_engine = next(iter(self.engines.values()))
        self.device = next(any_engine.module.parameters()).device
        # The boundary carries rows in the dtype the engines compute in (bf16 or fp32).
        self.boundary_dtype = next(any_engine.module.parameters()).dtype

        from .boundary import BoundaryCommunicator

        self.boundary = BoundaryCommunicator(
            cfg.stages["vision"], cfg.language, self.groups, cfg.placement,
            hidden_size=self.adapter.hidden_size,
        )
        self.timeline = Timeline()
        schedule = ColocatedSchedule if cfg.placement == "colocated" else DisaggregatedSchedule
        self.schedule = schedule(self)
        self.loader = (
            GlobalBatchLoader(training_data, cfg.global_batch_size, collate_fn, seed=seed)
            if training_data is not None else None
        )
        self.global_steps = 0
        # Called as (logits, labels, shifted) after each language micro-batch's loss, when set: client
        # metrics such as token accuracy from the engine's own loss pass (integrations/token_metrics.py).
        self.loss_observer = None

    # ------------------------------------------------------------------ training
    def needed_positions(self) -> set[int]:
        """Global-batch positions whose full sample this rank reads (its stages' shares).

        With balance "tokens" the vision share depends on the batch's image tokens: see
        `_vision_positions`, read once the batch's token ids are known.
        """
        from .step.shares import stage_samples

        needed: set[int] = set()
        for name, coord in self.coords.items():
            if name == "vision" and self.config.balance == "tokens":
                continue
            for m in range(self.config.micro_batches_of(name)):
                needed.update(stage_samples(self.config, name, coord.dp, m))
        return needed

    def _vision_positions(self, samples: Sequence[dict[str, Any]]) -> set[int]:
        """Positions of the samples with an image this rank's vision stage encodes this step."""
        dp = self.coords["vision"].dp
        try:
            return {p for v in range(self.config.micro_batches_of("vision"))
                    for p, _ in self.schedule.assignment(samples, v).images_of(dp)}
        except ValueError:  # a malformed sample: its language rank rejects it in _check_samples, on every rank
            return set()

    def _next_samples(self) -> list[dict[str, Any]]:
        if self.loader is None:
            raise ValueError("train_batch() without samples needs training_data at initialize()")
        batch = self.loader.load(self.global_steps, self.needed_positions())
        if "vision" in self.coords and self.config.balance == "tokens":
            self.loader.fill(self.global_steps, batch, self._vision_positions(batch))
        return batch

    def _agree_on_batch(self, samples: Sequence[dict[str, Any]]) -> int:
        """The global label-token count, after every rank of every stage accepted the batch.

        With samples passed in, every rank holds the same full list; from the loader a rank reads
        only its share. Either way one small all-reduce (`batch_agreement`) makes every rank
        raise alike, before any other collective of the step; it also sums the label tokens of
        the language shares (one tp x cp rank per language dp replica counts its share).
        """
        from .step.shares import stage_samples

        problem = batch_agreement.local_problem(samples, self.config.global_batch_size, self.adapter.check_sample)
        mine, inputs = 0, 0
        lang = self.coords.get("language")
        if problem is None:
            # the encoder assignment and the boundary plans of all micro-batches follow from the
            # images' row counts (every rank reads them from the token ids)
            try:
                inputs = batch_agreement.digest(tuple(self.adapter.image_rows(s)) for s in samples)
            except ValueError as exc:  # a malformed light sample, seen only through its token ids
                problem = str(exc)
            if lang is not None and lang.tp == 0 and lang.cp == 0:
                for m in range(self.config.micro_batches):
                    for p in stage_samples(self.config, "language", lang.dp, m):
                        mine += label_token_count(samples[p]["labels"])
        return batch_agreement.agree(problem, mine, self.groups.boundary, self.device, inputs)

    def train_batch(self, samples: Sequence[dict[str, Any]] | None = None) -> StepResult:
        """One optimizer step over the global batch (the same list on every rank)."""
        step = self.global_steps
        start = time.perf_counter()
        # lists / numpy converted; a collated dict or raw dataset rows refused by name (data/samples.py)
        samples = self._next_samples() if samples is None else as_sample_list(samples)

        try:  # every collective of the step, the batch agreement first, reports through one error
            n_labels = self._agree_on_batch(samples)  # a refused batch raises ValueError on every rank
            loss_sum, bytes_ = self.schedule.run(samples, n_labels, step)
            with self.timeline.span("optimizer.norm", "optimizer", step):
                norms = self._stage_norms()
            # Waiting here for the other rank set is idle time, not optimizer work.
            with self.timeline.span("boundary.combine", "boundary", step):
                grad_norm, loss_sum, n_labels = self._combine_norms_and_loss(norms, loss_sum, n_labels)
            with self.timeline.span("optimizer.step", "optimizer", step):
                applied = []
                for name, engine in self.engines.items():
                    with stage_context(self.mpus[name]):
                        applied.append(clipping.step_with_global_norm(engine, grad_norm, self.config.gradient_clipping))
        except RuntimeError as exc:  # a collective failed: a peer died, hung past the timeout, or raised
            raise RuntimeError(
                f"ds_hetero: rank {self.rank} ({', '.join(self.coords)}) failed in step {step}: a peer rank "
                f"stopped answering (it died, raised, or exceeded hetero_parallel.timeout_s = "
                f"{self.config.timeout_s:g} s); see the first failing rank's error. Cause: {exc}"
            ) from exc

        # The first step's exchanges checked rows, hidden size and dtype on every rank; from now on
        # the batch agreement's digest of each step's boundary inputs stands in for that consensus.
        self.boundary.validate = False
        self.global_steps += 1
        step_time = time.perf_counter() - start
        stage_time = self.timeline.step_stage_time(step)  # O(spans of this step)
        busy = self.timeline.step_busy(step)
        return StepResult(
            loss=loss_sum / n_labels,
            grad_norm=grad_norm,
            num_tokens=n_labels,
            num_samples=len(samples),
            step_time=step_time,
            stage_time=stage_time,
            boundary_bytes=bytes_["sent"],
            boundary_bytes_total=bytes_["total"],
            boundary_bytes_lower_bound=bytes_["lower_bound"],
            busy_time=busy,
            bubble_fraction=bubble_fraction(busy, step_time),
            skipped=not all(applied),  # as the stage engines counted it (a non-finite norm skips all)
        )

    def _stage_norms(self) -> dict[str, float]:
        """The gradient norm of every stage this rank holds (identical on all ranks of the stage)."""
        norms = {}
        for name, engine in self.engines.items():
            with stage_context(self.mpus[name]):
                norms[name] = clipping.stage_norm(engine, self.groups[name].tp)
        return norms

    def _combine_norms_and_loss(self, norms: dict[str, float], loss_sum: float | torch.Tensor, n_labels: int
                                ) -> tuple[float, float, int]:
        """(all-stage gradient norm, global loss sum, global label count) on every rank, in one all-reduce.

        Each stage's norm is identical on its ranks, so its first rank alone contributes it; the
        local loss sums come from tp rank 0 of every cp shard of every language dp replica, the label count from
        one language rank. In disaggregated placement this is how vision ranks learn the loss.
        """
        names = list(self.config.stages)
        vec = torch.zeros(len(names) + 2, dtype=torch.float64, device=self.device)
        for i, name in enumerate(names):
            if name in norms and self.rank == self.config.stages[name].ranks[0]:
                norm = norms[name]
                # DeepSpeed reports an invalid norm as -1: carry it as inf so every stage skips
                vec[i] = norm * norm if norm >= 0 and math.isfinite(norm) else float("inf")
        lang = self.coords.get("language")
        if lang is not None and lang.tp == 0:  # cp ranks hold the loss sums of their sequence shards
            vec[-2] = loss_sum
        if self.rank == self.config.language.ranks[0]:
            vec[-1] = n_labels
        dist.all_reduce(vec, group=self.groups.boundary)
        return math.sqrt(vec[: len(names)].sum().item()), vec[-2].item(), int(vec[-1].item())

    # ------------------------------------------------------------------ evaluation and export
    def eval_batch(self, samples: Sequence[dict[str, Any]]) -> float:
        """Forward only, no gradients: the loss of `samples` (full samples, the same list on every
        rank, any number), identical on every rank; see schedule/evaluation.py."""
        from .schedule.evaluation import EvaluationSchedule

        return EvaluationSchedule(self).run(samples)

    def save_pretrained(self, save_dir: str | os.PathLike) -> None:
        """A consolidated Hugging Face checkpoint (`from_pretrained(save_dir)`); all ranks call it.
        See checkpoint/hf_gather.py."""
        from .checkpoint.hf_gather import save_pretrained

        save_pretrained(self, save_dir)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None) -> str:
        """Save every stage under save_dir/<tag> with a manifest, then publish `latest`; all ranks call it.

        See ds_hetero/checkpoint/: `latest` names only a checkpoint every rank finished writing.
        """
        from .checkpoint import save_checkpoint

        return save_checkpoint(self, save_dir, tag)

    def load_checkpoint(self, load_dir: str | os.PathLike, tag: str | None = None) -> str:
        """Load save_dir's `latest` (or `tag`), saved with this layout or any other; all ranks call it."""
        from .checkpoint import load_checkpoint

        return load_checkpoint(self, load_dir, tag)

