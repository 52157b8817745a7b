"""HeteroEngine: one DeepSpeed engine per stage held by this rank, stepped as one model.

    engine = ds_hetero.initialize(model, "ds_config.json")
    result = engine.train_batch(samples)        # one optimizer step over the global batch

`ds_hetero.initialize` (entry.py) reads, plans and checks the config; the engine builds this
rank's StageSet (stages/build.py: groups, tp shards, stage modules, weights, one DeepSpeed
engine per held stage) and a boundary communicator per encoder stage, then runs each step:
the batch agreement, a StepPlan (step/step_plan.py), the schedule of the placement (schedule/),
one gradient norm over all stages and the clipped step (optimizer_step/global_step.py).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from .boundary import BoundaryCommunicator
from .config import HeteroConfig
from .data import agreement
from .data.loader import GlobalBatchLoader, prepare_dataset
from .data.planned_reader import PlannedReader
from .data.samples import as_sample_list
from .failures import is_collective_failure, own_failure, peer_failure
from .liveness import Liveness
from .loss import label_token_total
from .families import adapter_for
from .result import StepResult
from .schedule import ColocatedSchedule, DisaggregatedSchedule, PipelineSchedule
from .optimizer_step import global_step, norm_shares
from .stages.build import build_stage_set
from .step.rank_data import HeldShare, RankDataPath
from .step.step_plan import StepPlan
from .step.shares import stage_samples
from .timeline import Timeline, bubble_fraction


def boundaries(stages, hidden_size: int) -> dict[str, BoundaryCommunicator]:
    """A boundary communicator per encoder stage whose exchanges this rank takes part in (it holds
    the encoder or the destination), over that pair's own group (topology/groups.py).

    The destination is the language stage, or with a pipeline its first pipeline stage (the
    ranks that hold the embeddings): rows go there only, and their gradients come back from
    there. With a pipeline the placement of each pair is read from the rank sets.
    """
    language = stages.config.language
    dst = language.chunk(0) if language.pp > 1 else language
    placement = None if language.pp > 1 or stages.config.placement == "first_stage" else stages.config.placement
    return {stage.name: BoundaryCommunicator(stage.layout, dst, stages.groups, placement, hidden_size=hidden_size)
            for stage in stages.encoders if stages.groups.pair_member(stage.name)}


class HeteroEngine:
    """Trains a Hugging Face multimodal model with a per-stage parallel layout.

    Built by `ds_hetero.initialize(model, config, training_data=None, collate_fn=None, *,
    optimizer=None, seed=0, weights=None)`:
    optimizer   optional factory `params -> torch.optim.Optimizer` used for every stage (as
                `deepspeed.initialize(optimizer=callable)`); otherwise the DeepSpeed config's
                "optimizer" section builds each stage's optimizer
    seed        order of the training data and the stages' model-parallel dropout streams
                (tensor_parallel/rng.py); the same on every rank
    weights     a Hugging Face safetensors checkpoint directory: `model` may then be built on the
                meta device (`ds_hetero.meta_model(DIR)`), and each rank reads and allocates only
                its own stages' tp shards (ds_hetero/weights/); `load_report` says what it read

    The process groups wait at most `hetero_parallel.timeout_s` (default 300 s) in a collective:
    a dead or stuck peer makes every other rank raise instead of hanging forever.
    In disaggregated placement a rank holds only its own stages: the other stages' modules of
    `model` are moved to the meta device (their memory is freed).

    `stages` is this rank's StageSet: what schedules, evaluation and checkpoints work on.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: HeteroConfig,
        training_data: Any = None,
        collate_fn: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
        *,
        optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
        seed: int = 0,
        adapter=None,
        checkpoint=None,
    ):
        if not isinstance(config, HeteroConfig):
            raise TypeError("HeteroEngine takes a parsed HeteroConfig: build the engine with "
                            "ds_hetero.initialize(model, config), which reads, plans and checks the config")
        self.model, self.config = model, config
        self.adapter = adapter if adapter is not None else adapter_for(model)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stages, self.load_report = build_stage_set(model, config, self.adapter, self.rank, optimizer, checkpoint,
                                                        seed)
        global_step.check_clippable(self.stages)
        self.norm_sharing = norm_shares.sharing_stages(self.stages)  # whose norm the combining all-reduce sums
        self.boundaries = boundaries(self.stages, self.adapter.hidden_size)
        # what a data path (the loader below, the Trainer's) needs of this rank: its shares, the step's plan
        self.data_path = RankDataPath(config, self.adapter, [HeldShare(s.name, s.coord.dp, s.passes)
                                                             for s in self.stages.held], self.stages.boundary_group)
        self.timeline = Timeline()
        # "mixed" (some encoders colocated with the language stage, some apart) runs the two-stage
        # 1F1B schedule: it treats a colocated pair as a pair whose exchange copies rows locally.
        schedule = (PipelineSchedule if config.language.pp > 1 else
                    ColocatedSchedule if config.placement == "colocated" else DisaggregatedSchedule)
        self.schedule = schedule(self.stages, self.boundaries, self.adapter, self.timeline)
        # a dataset with a length index measures it here, every rank a share, before the first step
        self.loader = (
            GlobalBatchLoader(prepare_dataset(training_data, self.stages.boundary_group), config.global_batch_size,
                              collate_fn, seed=seed)
            if training_data is not None else None
        )
        self._reader: PlannedReader | None = None  # started at the first train_batch() without samples
        self.global_steps = 0
        self._failed: str | None = None  # why a step failed mid-way: every later call refuses (ranks out of step)
        # TFLOP/s and MFU per step (throughput/meter.py, set by `initialize`: a client of the planner's
        # shape readers); None: the step reports none
        self.throughput = None
        # heartbeats that name a dead rank when a step fails (failures.py), keyed by this engine's group
        self._liveness = Liveness(getattr(self.stages.boundary_group, "group_name", "default"), self.rank, self)

    @property
    def loss_observer(self):
        """Called as (logits, labels, shifted) after each training micro-batch's language loss, when
        set: client metrics such as token accuracy from the engine's own loss pass
        (integrations/trainer/token_metrics.py)."""
        return self.schedule.loss_observer

    @loss_observer.setter
    def loss_observer(self, observer) -> None:
        self.schedule.loss_observer = observer

    # ------------------------------------------------------------------ views for users and integrations
    @property
    def engines(self) -> dict[str, Any]:
        """The DeepSpeed engine of every stage this rank holds."""
        return {s.name: s.engine for s in self.stages.held}

    @property
    def groups(self):
        """Every stage's process groups (topology/groups.py) and the boundary group."""
        return self.stages.groups

    @property
    def device(self) -> torch.device:
        return self.stages.device

    # ------------------------------------------------------------------ training
    def _next_samples(self, step: int) -> tuple[list[dict[str, Any]], StepPlan | None, str | None, float]:
        """(the step's batch: this rank's shares in full, the rest light; its plan; the problem that stopped
        this rank reading its share, for the batch agreement; seconds waited for the reader)."""
        if self.loader is None:
            raise ValueError("train_batch() without samples needs training_data at initialize()")
        if self._reader is None:
            self._reader = PlannedReader(self.data_path, self.loader, self.config.data_workers,
                                         self.config.prefetch_steps, self.config.timeout_s)
        with self.timeline.span("data.wait", "data", step):
            return self._reader.next(step)

    def _agree_on_batch(self, samples: Sequence[dict[str, Any]], plan: StepPlan | None = None,
                        read_problem: str | None = None) -> int:
        """The global label-token count, after every rank of every stage accepted the batch.

        With samples passed in, every rank holds the same full list; from the loader a rank reads
        only its share. Either way one small all-reduce (data/agreement.py) makes every rank
        raise alike, before any other collective of the step; it also sums the label tokens of
        the language shares (one tp x cp rank per language dp replica counts its share).
        """
        problem = read_problem or agreement.local_problem(samples, self.config.global_batch_size,
                                                          self.adapter.check_sample)
        if problem is None and plan is None and self.config.packed:
            problem = "the batch could not be planned (language_batching \"packed\" reads every sample's input_ids)"
        mine, inputs = 0, 0
        language = self.stages.language
        if problem is None:
            # the encoder assignments and the boundary plans of all micro-batches follow from the
            # items' row counts (every rank reads them from the token ids)
            try:  # the plan read them already (the same `port.rows`); without a plan, read them here
                inputs = agreement.digest(plan.item_rows(len(samples)) if plan is not None else
                                          (tuple(tuple(port.rows(s)) for port in self.adapter.encoders().values())
                                           for s in samples))
            except ValueError as exc:  # a malformed light sample, seen only through its token ids
                problem = str(exc)
            # one pipeline stage counts (every pipeline stage of a dp replica reads the same samples)
            if language.held and language.coord.tp == 0 and language.coord.cp == 0 and language.coord.pp == 0:
                # any partition of the batch over the dp replicas sums to the global count: the
                # samples cut's shares, or (loader, packed) the shares whose samples this rank read
                shares = (plan.language_positions(language.coord.dp) if plan is not None and self.config.packed
                          else [p for m in range(self.config.micro_batches)
                                for p in stage_samples(self.config, language.name, language.coord.dp, m)])
                mine = label_token_total([samples[p]["labels"] for p in shares])
        return agreement.agree(problem, mine, self.stages.boundary_group, self.device, inputs)

    def train_batch(self, samples: Sequence[dict[str, Any]] | None = None, *,
                    read_problem: str | None = None) -> StepResult:
        """One optimizer step over the global batch (the same list on every rank; None: the engine's own
        loader). `read_problem`: why this rank could not read its rows of the batch (a caller's reader,
        e.g. the Trainer's): the batch agreement then refuses the step on every rank with that text."""
        self._refuse_if_failed("train_batch")
        step = self.global_steps
        start = time.perf_counter()
        # lists / numpy converted; a collated dict or raw dataset rows refused by name (data/samples.py)
        data_wait = 0.0
        if samples is None:
            samples, plan, read_problem, data_wait = self._next_samples(step)
        else:
            samples, plan = as_sample_list(samples), None

        if plan is None:  # built once, before the agreement: it digests the plan's item rows, and with
            # packed batching the plan's language shares say who counts which labels
            plan = self.data_path.plan_of(samples)  # None for a malformed batch: the agreement refuses it
        try:  # the batch agreement: a refused batch raises ValueError on every rank alike, engine usable
            n_labels = self._agree_on_batch(samples, plan, read_problem)
        except Exception as exc:
            if is_collective_failure(exc):
                raise self._stopped(self._peer_failure(exc, step), step) from exc
            raise
        try:  # every other collective and this rank's own work of the step report through one error
            plan = plan or StepPlan(self.config, self.adapter.encoders(), samples,
                                    language_cost=self.adapter.language_cost,
                                    dense_attention=self.adapter.dense_rows(self.config.packed_attention))
            self.schedule.start_counts()  # boundary bytes, a MoE language stage's aux-loss shares
            self.stages.start_step(step)  # the dropout streams restart from (seed, step): resumes draw the same
            with self.stages.reduce_once():  # a shared stage engine: one gradient reduction after every pass
                loss_sum = self.schedule.run(samples, plan, n_labels, step)
            with self.timeline.span("optimizer.norm", "optimizer", step):
                norms = global_step.stage_norms(self.stages, self.norm_sharing)
            # Waiting here for the other rank set is idle time, not optimizer work.
            with self.timeline.span("boundary.combine", "boundary", step):
                grad_norm, loss_sum, n_labels, aux = global_step.combine_norms_and_loss(
                    self.stages, norms, loss_sum, n_labels, self.schedule.aux_sum)
            with self.timeline.span("optimizer.step", "optimizer", step):
                applied = global_step.step_all(self.stages, grad_norm, self.config.gradient_clipping,
                                                 plan.idle_encoders())
        except Exception as exc:  # failures.py: this rank's own error as itself, or which peer stopped
            if is_collective_failure(exc):
                raise self._stopped(self._peer_failure(exc, step), step) from exc
            raise self._stopped(own_failure(exc, self.stages.boundary_group, self.rank, self._held_names(), step),
                                step, own=True)

        # The first step's exchanges checked rows, hidden size and dtype on every rank; from now on
        # the batch agreement's digest of each step's boundary inputs stands in for that consensus.
        for boundary in self.boundaries.values():
            boundary.trust_inputs()
        self.global_steps += 1
        step_time = time.perf_counter() - start
        throughput = self.throughput.figures(plan, step_time) if self.throughput is not None else {}
        self.timeline.count("throughput", step, {k: v for k, v in throughput.items()
                                                 if k in ("tflops_per_device/model", "mfu/model")})
        stage_time = self.timeline.step_stage_time(step)  # O(spans of this step)
        busy = self.timeline.step_busy(step)
        bytes_ = self.schedule.bytes
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
            boundary_bytes_backward=bytes_["backward"],
            boundary_bytes_backward_lower_bound=bytes_["backward_lower_bound"],
            busy_time=busy,
            bubble_fraction=bubble_fraction(busy, step_time - data_wait),  # waiting for data is not a bubble
            data_wait=data_wait,
            skipped=not all(applied),  # as the stage engines counted it (a non-finite norm skips all)
            aux_loss=aux if self.adapter.has_aux_loss else None,
            language_tokens=plan.language_load(),  # O(samples) on the host, no communication
            throughput=throughput,
        )

    def _held_names(self) -> str:
        return ", ".join(s.name for s in self.stages.held)

    def _stopped(self, error: BaseException, step: int, own: bool = False) -> BaseException:
        """`error`, after marking the engine failed: past the batch agreement a step that fails leaves the
        ranks at different points of it (some may have stepped their optimizers, some not; a collective
        entered by some only), so no later call may enter a collective that could pair with another
        step's. A refused batch (the agreement's ValueError) is not this: every rank refused it alike."""
        text = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:400]}"
        self._failed = f"step {step} failed " + (f"on rank {self.rank} ({text})" if own else f"({text})")
        return error

    def _refuse_if_failed(self, what: str) -> None:
        if self._failed is not None:
            raise RuntimeError(
                f"ds_hetero: {what} refused on rank {self.rank}: {self._failed}, so the ranks may be out of step "
                f"(their collectives could pair across steps); restore from a checkpoint: start the job again "
                f"and call load_checkpoint")

    def _peer_failure(self, exc: BaseException, step: int) -> RuntimeError:
        return peer_failure(exc, self.stages.boundary_group, self.stages.groups.boundary_ranks, self.rank,
                            self._held_names(), step, self.config.timeout_s, self._liveness)

    # ------------------------------------------------------------------ evaluation and export
    def eval_batch(self, samples: Sequence[dict[str, Any]]) -> float:
        """Forward only, no gradients: the loss of `samples` (full samples, the same list on every
        rank, any number), identical on every rank; see schedule/evaluation.py."""
        from .schedule.evaluation import EvaluationSchedule
        from .schedule.pipeline_eval import PipelineEvaluationSchedule

        self._refuse_if_failed("eval_batch")
        schedule = PipelineEvaluationSchedule if self.config.language.pp > 1 else EvaluationSchedule
        return schedule(self.stages, self.boundaries, self.adapter, self.timeline).run(samples)

    def save_pretrained(self, save_dir: str | os.PathLike) -> None:
        """A consolidated Hugging Face checkpoint (`from_pretrained(save_dir)`); all ranks call it.
        See checkpoint/hf_gather.py."""
        from .checkpoint.hf_gather import save_pretrained

        self._refuse_if_failed("save_pretrained")
        save_pretrained(self.stages, self.model, save_dir)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None) -> str:
        """Save every stage under save_dir/<tag> with a manifest, then publish `latest`; all ranks call it.
        A pipelined language stage is saved by each chunk's engine, with the layer cut recorded.

        See ds_hetero/checkpoint/: `latest` names only a checkpoint every rank finished writing.
        """
        from .checkpoint import save_checkpoint

        self._refuse_if_failed("save_checkpoint")  # it would save weights some ranks stepped and others not
        return save_checkpoint(self.stages, self.model, save_dir, tag, self.global_steps, self._data_position())

    def load_checkpoint(self, load_dir: str | os.PathLike, tag: str | None = None) -> str:
        """Load save_dir's `latest` (or `tag`), saved with this layout or any other (tp, dp, pp and the
        layer cut included); all ranks call it."""
        from .checkpoint import load_checkpoint

        self._refuse_if_failed("load_checkpoint")  # the ranks may sit in different collectives: a fresh job loads
        tag, self.global_steps = load_checkpoint(self.stages, load_dir, tag, self._data_position(), self.model)
        return tag  # the loader continues from the saved step: its order is a function of (seed, step)

    def _data_position(self) -> dict[str, Any]:
        from .checkpoint.manifest import data_position

        return data_position(self.global_steps, self.config.global_batch_size, self.loader)

