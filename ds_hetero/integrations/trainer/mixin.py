"""Any Hugging Face Trainer class made heterogeneous with one line: `ds_hetero.hetero(SFTTrainer)`.

    trainer = ds_hetero.hetero(SFTTrainer)(model=model, args=args, train_dataset=data, processing_class=proc)
    # or, in a class statement:  class MyTrainer(ds_hetero.HeteroTrainerMixin, CustomSeq2SeqTrainer): ...

`hetero(cls)` returns `class Hetero<cls>(HeteroTrainerMixin, cls)`: the mixin comes first in the
MRO, so its overrides win and every method it does not override (the subclass's `__init__`, its
dataset preparation and collator, `create_scheduler`, callbacks, model cards) runs as written.

What the mixin overrides (two are private Trainer hooks):
    _wrap_model          builds the HeteroEngine from the DeepSpeed config the Trainer filled
                         ("auto" values from TrainingArguments) and hands back `HeteroModel`
    create_scheduler     the subclass's scheduler (then the Trainer's) drives `HeteroOptimizer`, a live
                         view of every stage optimizer's param_groups
    training_step        prepares this rank's samples of the global batch and runs `engine.train_batch`;
                         the all-stage grad norm reaches the Trainer's `grad_norm`. A dataset with a
                         length index (SFTDataset: prepared at construction) is read as the launcher reads
                         it (indexed_batch.py: index ids, real rows only at this rank's positions, ahead in
                         `dataloader_num_workers` processes); any other through the user's data_collator,
                         only this rank's rows, ids exchanged per step (rank_batch.py)
    get_train_dataloader the global batch's dataset indices, the same on every rank: ds_hetero's seeded
                         order (`data_seed` or `seed`), or the subclass's `_get_train_sampler` order
    evaluate             `engine.eval_batch` per global batch, label-token weighted
    save_model           `engine.save_pretrained` (TP and ZeRO gathered, HF names); for a PEFT LoRA model
                         the adapter PeftModel.from_pretrained loads (peft_adapter.py)
    log                  adds the per-stage metrics, and TRL's / ms-swift's token metrics from the engine's
                         loss pass (framework_metrics.py); the stock log printer is replaced by one line of
                         named numbers per log, the layout line first (log_lines.py)
    floating_point_ops   0 for the Trainer's index batches: training_step counts `total_flos` on the
                         prepared global batch instead
A subclass's `create_optimizer` is honoured (trainer_loss.per_stage_optimizer); whatever its
`compute_loss` would change is refused by name (trainer_loss.check_loss_options).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ...config.schema import SECTION
from ...data.loader import prepare_dataset
from ...errors import HeteroConfigError
from .callback import HeteroCallback
from ...loss import label_token_count
from ..ds_config import is_derived_mismatch, trainer_ds_config
from ..metrics import StepMetrics
from . import framework_metrics
from .indexed_batch import IndexedBatches, has_length_index
from .log_lines import swap_printers
from .peft_adapter import save_peft_adapter
from .rank_batch import RankBatch
from .read_ahead import read_ahead
from .token_metrics import TokenMetrics
from .loss_options import check_loss_options, overrides, per_stage_optimizer
from .parts import (GlobalBatch, GlobalBatchDataLoader, GlobalBatchSampler, HeteroModel, HeteroOptimizer,
                    IndexDataset, NormSource, SamplerBatches)


class HeteroTrainerMixin:
    """Put first in the bases of any `transformers.Trainer` subclass (or use `ds_hetero.hetero(cls)`)."""

    _ds_hetero_mixin = True
    hetero_engine_loss = False  # hetero(cls, engine_loss=True): the subclass's compute_loss is loss-neutral

    def __init__(self, *args, weights=None, **kwargs):
        """`weights`: a Hugging Face safetensors checkpoint directory for a model built on the meta
        device (`ds_hetero.meta_model(path)`): every rank reads only its stages' tp shards of it."""
        self._hetero_weights = weights
        callbacks = [cb() if isinstance(cb, type) and issubclass(cb, HeteroCallback) else cb
                     for cb in kwargs.get("callbacks") or []]
        for cb in callbacks:
            if isinstance(cb, HeteroCallback):
                cb._in_hetero_trainer = True  # the guard has nothing to stop here
        if callbacks:
            kwargs["callbacks"] = callbacks
        user_collator = kwargs.get("data_collator", args[2] if len(args) > 2 else None)
        _prepare_indexed(args, kwargs)  # before the Trainer's __init__, which calls len(train_dataset)
        super().__init__(*args, **kwargs)
        if not self.is_deepspeed_enabled:
            raise HeteroConfigError(
                "TrainingArguments.deepspeed", f"{type(self).__name__} needs DeepSpeed: TrainingArguments(deepspeed="
                "<DeepSpeed JSON path or dict with a hetero_parallel section>), or `accelerate launch` with a "
                "DeepSpeed config and DS_HETERO_PARALLEL naming the section")
        # Every conflict now, on every rank, before any collective (the Trainer itself would raise
        # its mismatches only at train(), and would not know ours).
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        self._hetero_config, _ = trainer_ds_config(self.args, plugin)
        self._hetero_read_ahead = read_ahead(self.args, self._hetero_config[SECTION])
        check_loss_options(self)
        # The per-device micro batch and accumulation are per stage in ds_hetero (its config checks
        # them); keep the Trainer's deepspeed_init from re-raising its own comparison of them.
        hf_config = self.args.hf_deepspeed_config
        hf_config.mismatches = [m for m in hf_config.mismatches if not is_derived_mismatch(m)]
        self._hetero_collate = None if user_collator is None and _is_default_collator(self.data_collator) \
            else self.data_collator
        self.hetero: HeteroModel | None = None
        self._hetero_metrics = StepMetrics()
        self._hetero_aux: list[float] = []  # StepResult.aux_loss of the steps since the last log (MoE)
        self._hetero_rows: RankBatch | IndexedBatches | None = None
        self._hetero_order = None  # ds_hetero's seeded order of the train dataloader (step -> indices)
        self._hetero_tokens: TokenMetrics | None = None
        swap_printers(self, self._hetero_layout)

    def _hetero_layout(self) -> str | None:
        """The layout line (reporting/layout_line.py) the first printed log starts with; None before the engine."""
        from ...reporting import data_source, layout_line

        if self.hetero is None:
            return None
        dataset = self.train_dataset
        file = getattr(dataset, "name", None) if has_length_index(dataset) else None
        return layout_line(self.hetero.engine.config,
                           data_source(dataset, file, kind=f"{type(dataset).__name__} (in memory)"))

    # ------------------------------------------------------------------ engine
    @property
    def hetero_engine(self):
        """The HeteroEngine (built on first use: train, evaluate or save)."""
        return self._ensure_engine().engine

    @property
    def rows_prepared(self) -> int:
        """Training rows this rank read and collated so far (its stages' shares only)."""
        return 0 if self._hetero_rows is None else self._hetero_rows.rows_prepared

    def _ensure_engine(self) -> HeteroModel:
        if self.hetero is not None:
            return self.hetero
        from ...entry import initialize

        cfg = self._hetero_config
        # The Trainer fills its remaining "auto" values (ZeRO bucket sizes) in deepspeed_init at
        # train(); outside train() (evaluate or save first) fill them here the same way.
        hf_config = self.args.hf_deepspeed_config
        hf_config.trainer_config_finalize(self.args, self.model, 0)
        cfg = {**cfg, "zero_optimization": hf_config.config.get("zero_optimization", cfg.get("zero_optimization"))}
        factory = None
        if "optimizer" not in cfg:
            mine = self.optimizer
            if isinstance(mine, torch.optim.Optimizer) and not isinstance(mine, HeteroOptimizer) \
                    and overrides(self, "create_optimizer"):
                # the subclass's own optimizer (class, per-group hyperparameters), rebuilt per stage
                factory = per_stage_optimizer(mine, self.model)
            else:  # TrainingArguments.optim for every stage, as the Trainer would build it
                cls, kw = self.get_optimizer_cls_and_kwargs(self.args, self.model)
                factory = lambda params: cls(params, **kw)  # noqa: E731
            cfg["zero_allow_untested_optimizer"] = True
        self._hetero_flops = framework_metrics.flops_per_token(self.model)  # before stages are sharded
        engine = initialize(self.model, cfg, optimizer=factory, seed=self._data_seed(), weights=self._hetero_weights)
        self.hetero = HeteroModel(engine)
        self.accelerator.deepspeed_engine_wrapped = NormSource(self.hetero)
        self._hetero_tokens = TokenMetrics(engine) if framework_metrics.framework(self) else None
        return self.hetero

    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        if training:
            return self._ensure_engine()
        return self.hetero if self.hetero is not None else model

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.hetero is not None and not isinstance(self.optimizer, HeteroOptimizer):
            self.optimizer, self.lr_scheduler = HeteroOptimizer(self.hetero.engine), None
        return super().create_scheduler(num_training_steps, optimizer=self.optimizer)

    # ------------------------------------------------------------------ step
    def _train_rows(self, engine) -> RankBatch | IndexedBatches:
        """This rank's data path for the training set: the launcher's reader where the dataset has a
        length index (and no collator stands between rows and samples), else the collator's."""
        if self._hetero_rows is None or self._hetero_rows.path is not engine.data_path:
            self._close_rows()
            dataset = self._hetero_dataset(self.train_dataset, "training")
            if self._hetero_collate is None and has_length_index(dataset):
                workers, steps = self._hetero_read_ahead
                order = self._hetero_order.indices if self._hetero_order is not None else None
                self._hetero_rows = IndexedBatches(engine.data_path, dataset, order, workers, steps,
                                                   engine.config.timeout_s)
            else:
                self._hetero_rows = RankBatch(engine.data_path, dataset, self._hetero_collate)
        return self._hetero_rows

    def _close_rows(self) -> None:
        """Stops the read-ahead workers (a later step starts fresh ones at that step)."""
        if isinstance(self._hetero_rows, IndexedBatches):
            self._hetero_rows.close()

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:  # the workers stop with training (they would read steps never trained)
            self._close_rows()

    def training_step(self, model, inputs, num_items_in_batch=None):
        waited, problem = 0.0, None
        if isinstance(inputs, GlobalBatch):  # dataset indices: this rank reads its share
            rows = self._train_rows(model.engine)
            start = time.perf_counter()
            inputs = rows.build(inputs, step=model.engine.global_steps)
            waited = time.perf_counter() - start
            problem = getattr(rows, "problem", None)  # a row the reader could not read: refused on every rank
        r = model.engine.train_batch(inputs, read_problem=problem)
        r = dataclasses.replace(r, data_wait=waited)  # outside train_batch's step_time: its bubble stands
        model.last = r
        self.current_flos += framework_metrics.flops_share(self._hetero_flops, inputs, self.args.world_size)
        self._hetero_metrics.add(r)
        if r.aux_loss is not None:
            self._hetero_aux.append(r.aux_loss)
        if hasattr(self, "_total_train_tokens"):  # TRL's num_tokens: the non-padding tokens of every rank's batch
            self._total_train_tokens += sum(int(s["input_ids"].numel()) for s in inputs)
        return torch.tensor(r.loss, device=self.args.device)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.hetero is not None and self._hetero_metrics.steps:
            logs.update(self._hetero_metrics.reduce(self.hetero.engine.groups.boundary))
            if self._hetero_tokens is not None:  # where TRL's / ms-swift's log reads them
                framework_metrics.publish(self, self._hetero_tokens, logs)
                if self._hetero_aux and framework_metrics.framework(self) == "trl":  # TRL's aux_loss: their mean
                    self._metrics["train"]["aux_loss"] = [sum(self._hetero_aux) / len(self._hetero_aux)]
            self._hetero_aux.clear()
        super().log(logs, start_time)

    def floating_point_ops(self, inputs) -> float:
        # the Trainer's inputs are dataset indices here; training_step counts the prepared batch
        return 0.0 if isinstance(inputs, GlobalBatch) else super().floating_point_ops(inputs)

    # ------------------------------------------------------------------ data
    def _global_batch_size(self) -> int:
        return self.args.per_device_train_batch_size * self.args.world_size  # == DS train_batch_size

    def _hetero_dataset(self, dataset, description: str):
        """The dataset as the stock Trainer would read it (unused columns removed for a datasets.Dataset)."""
        try:
            import datasets
        except ImportError:
            return dataset
        if isinstance(dataset, datasets.Dataset) and self._hetero_collate is not None:
            return self._remove_unused_columns(dataset, description=description)
        return dataset

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError(f"{type(self).__name__}: training requires a train_dataset")
        dataset = self._hetero_dataset(self.train_dataset, "training")
        size = self._global_batch_size()
        strategy = getattr(self.args, "train_sampling_strategy", "random")
        if strategy == "batch_rebalance":  # its sampler gives each rank its own batches
            raise HeteroConfigError(
                "train_sampling_strategy", '"batch_rebalance" splits batches by world rank; ds_hetero splits the '
                'global batch per stage itself: use "random", "sequential" or "group_by_length"')
        if overrides(self, "_get_train_sampler") or strategy != "random":
            # the subclass's or TrainingArguments' order (sequential, grouped by length), the same on every rank
            sampler = SamplerBatches(self._get_train_sampler(dataset), size)
        else:  # ds_hetero's seeded order (data_seed or seed): the batches ds_hetero.initialize would draw
            sampler = GlobalBatchSampler(dataset, size, self._data_seed())
        # known ahead for every step: the length-index reader's workers read the next steps' rows
        self._hetero_order = sampler.order if isinstance(sampler, GlobalBatchSampler) else None
        # Not accelerator-prepared: every rank walks the same global batches; each reads its stages' rows
        return GlobalBatchDataLoader(IndexDataset(len(dataset)), batch_sampler=sampler, collate_fn=GlobalBatch)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss = (token losses of the whole eval set) / (its label tokens), as one forward of the
        single-process model over all of it would give; the same on every rank."""
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError(f"{type(self).__name__}: evaluation requires an eval_dataset")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        engine = self._ensure_engine().engine
        rows = RankBatch(engine.data_path, self._hetero_dataset(dataset, "evaluation"), self._hetero_collate)
        start = time.time()
        size = engine.config.global_batch_size
        loss_sum, n_labels, n_batches = 0.0, 0, 0
        for first in range(0, len(dataset), size):
            samples = rows.full_samples(range(first, min(first + size, len(dataset))))
            n = sum(label_token_count(s["labels"]) for s in samples)
            if n:
                loss_sum += engine.eval_batch(samples) * n
                n_labels += n
            n_batches += 1
        runtime = time.time() - start
        metrics = {
            f"{metric_key_prefix}_loss": loss_sum / n_labels if n_labels else math.nan,
            f"{metric_key_prefix}_runtime": round(runtime, 4),
            f"{metric_key_prefix}_samples_per_second": round(len(dataset) / runtime, 3),
            f"{metric_key_prefix}_steps_per_second": round(n_batches / runtime, 3),
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ------------------------------------------------------------------ export
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A consolidated Hugging Face checkpoint of the current weights; every rank must call it."""
        import os

        from transformers.trainer import TRAINING_ARGS_NAME

        output_dir = output_dir or self.args.output_dir
        if self.hetero is None:  # nothing built yet: the model is still whole
            if self.args.should_save:
                self.model.save_pretrained(output_dir)
        elif type(self.model).__name__.startswith("Peft"):  # the adapter, as a stock PEFT run saves it
            save_peft_adapter(self.hetero.engine, self.model, output_dir)
        else:
            self.hetero.engine.save_pretrained(output_dir)
        if self.args.should_save:
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))


def _prepare_indexed(args: tuple, kwargs: dict) -> None:
    """The length index of a train / eval dataset that has one (SFTDataset), built by every rank together.

    Here, not at engine creation: the Trainer's own __init__ asks len(train_dataset), which would make
    every rank measure every row alone. The group is the default one: the engine's boundary group spans
    every rank of every stage, the same ranks, and the index does not depend on the group (it only splits
    the measuring); a later prepare() of the built index is a no-op."""
    training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
    found = []
    for key, at in (("train_dataset", 3), ("eval_dataset", 4)):
        data = kwargs.get(key, args[at] if len(args) > at else None)
        found += [d for d in (data.values() if isinstance(data, dict) else [data]) if has_length_index(d)]
    if found and training_args is not None:
        training_args.device  # noqa: B018 -- sets up torch.distributed (the Trainer's __init__ would, next)
    for dataset in found:  # every rank: the world group, named (no engine, so no boundary group, yet)
        prepare_dataset(dataset, dist.group.WORLD if dist.is_initialized() else None)


def _is_default_collator(collator) -> bool:
    """The collator the Trainer picks when none is given: it stacks or pads per-key, which per-sample
    dicts of different lengths do not need (the engine pads them)."""
    from transformers import DataCollatorWithPadding, default_data_collator

    return collator is default_data_collator or type(collator) is DataCollatorWithPadding


def hetero(trainer_cls, *, engine_loss: bool = False):
    """`trainer_cls` made heterogeneous: `class Hetero<Name>(HeteroTrainerMixin, trainer_cls)`.

    engine_loss  declare that the class's own `compute_loss` override computes the standard token
                 cross-entropy (or only logs): the engine computes that loss itself
    """
    from transformers import Trainer

    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"ds_hetero.hetero takes a transformers.Trainer subclass, got {trainer_cls!r}")
    if issubclass(trainer_cls, HeteroTrainerMixin) and not engine_loss:
        return trainer_cls
    namespace = {"__module__": trainer_cls.__module__, "__qualname__": f"Hetero{trainer_cls.__qualname__}",
                 "__doc__": f"{trainer_cls.__name__}, heterogeneous (ds_hetero.hetero)", "_ds_hetero_mixin": True,
                 "hetero_engine_loss": engine_loss}
    return type(f"Hetero{trainer_cls.__name__}", (HeteroTrainerMixin, trainer_cls), namespace)
