"""StageSet: what this rank holds of every stage, built once by `initialize` and passed explicitly.

A `Stage` is this rank's view of one stage of the model: its layout and process groups always
(every rank builds every group, groups.py), and, where the rank runs the stage, its coordinate,
its StageMPU, its DeepSpeed engine and its module. Its methods enter the stage's context
themselves (topology/mpu.py `stage_context`: DeepSpeed's process-global mpu must point at the
stage whose engine is called), so no caller has to remember it.

Schedules, evaluation, checkpoints and the integrations take a StageSet (or one Stage, or one
group), never the engine. Stages are generic: any number of encoder stages feeding the one
`language` stage, each with its own layout; nothing here names an encoder.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from ..config import LANGUAGE, HeteroConfig
from ..topology.groups import HeteroGroups, StageGroups
from ..layout import Coord, StageLayout
from ..topology.mpu import StageMPU, stage_context


@dataclass
class Stage:
    """One stage as this rank sees it.

    module    the stage module cut from the model (on the meta device where this rank does not hold it)
    engine    the stage's DeepSpeedEngine on this rank, None where it does not hold the stage
    passes    forward/backward passes per optimizer step (its gradient_accumulation_steps)
    trains    whether any of its parameters trains; a frozen stage (models/freeze.py) has an
              engine without optimizer, runs its forward under no_grad unless a later stage
              needs gradients through it (the language stage, for a trained encoder), never
              steps, and an encoder that does not train gets no boundary backward
    """

    name: str
    layout: StageLayout
    groups: StageGroups
    module: nn.Module
    passes: int
    trains: bool = True
    mpu: StageMPU | None = None
    engine: Any = None
    tied: Any = None  # a pipelined language stage's TiedCopy of a tied embedding (stages/tied_embeddings.py)
    rng: Any = None  # its model-parallel dropout streams (tensor_parallel/rng.py), None where nothing draws from them
    # the stage whose folder holds the engine's checkpoint files, where this stage shares its engine
    # with others (stages/shared_engine.py); None where the stage has an engine of its own
    engine_owner: str | None = None

    @property
    def held(self) -> bool:
        return self.engine is not None

    @property
    def coord(self) -> Coord:
        return self.groups.coord

    @property
    def first_rank(self) -> int:
        """The stage's rank 0 (it writes the stage's files and contributes its gradient norm once)."""
        return self.layout.ranks[0]

    @property
    def norm_rank(self) -> int:
        """The rank that contributes this rank's part of the stage to the global gradient norm:
        the stage's rank 0, or with a pipeline the rank 0 of this rank's pipeline stage (each
        pipeline stage's engine holds only its own layers)."""
        return self.layout.rank_at(pp=self.coord.pp)

    @property
    def owns_engine(self) -> bool:
        """Whether this stage's engine is its own or it built the shared one: the stage that steps
        the engine, saves its files and contributes its norm (once for all the stages sharing it)."""
        return self.engine_owner in (None, self.name)

    @property
    def pipeline(self) -> bool:
        return self.layout.pp > 1

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with stage_context(self.mpu):
            yield

    def __call__(self, *args, grad: bool | None = None, **kwargs):
        """The stage's forward; `grad`: whether to record autograd (default: whether it trains).

        A stage that does not train runs its module directly: the engine's forward would hook
        its outputs for `engine.backward`, which refuses the plain backward `backward()` takes."""
        with stage_context(self.mpu), torch.set_grad_enabled(torch.is_grad_enabled() and (
                self.trains if grad is None else grad)):
            if self.engine_owner is not None:  # the shared engine runs this stage's module by name
                return self.engine(self.name, *args, **kwargs)
            return (self.engine if self.trains else self.engine.module)(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """The engine's backward; for a stage that does not train (only gradients through it, to
        an earlier stage's boundary rows) plain autograd with DeepSpeed's scaling by the passes."""
        if not self.trains:
            (loss / self.passes).backward()
            return
        with stage_context(self.mpu):
            if self.engine_owner is not None:  # the shared engine takes one accumulation step: the passes are ours
                self.engine.backward(loss / self.passes)
            else:
                self.engine.backward(loss)

    def micro_step(self) -> None:
        """DeepSpeed's `step()` between micro-batches: it counts the micro-step and updates nothing.
        The last micro-batch's step is the clipped one (optimizer_step/clipping.py). None when frozen,
        or with a shared engine (it takes one accumulation step per optimizer step)."""
        if not self.trains or self.engine_owner is not None:
            return
        with stage_context(self.mpu):
            self.engine.step()

    @property
    def optimizer_name(self) -> str | None:
        if not self.trains:
            return None
        optimizer = self.engine.optimizer
        return type(getattr(optimizer, "optimizer", optimizer)).__name__


@dataclass
class StageSet:
    """Every stage of the config, in its order, as this rank sees it; the boundary group spans them."""

    rank: int
    config: HeteroConfig
    groups: HeteroGroups
    stages: Mapping[str, Stage]
    device: torch.device
    dtype: torch.dtype  # what the engines compute in: the boundary carries rows in it

    def __getitem__(self, name: str) -> Stage:
        return self.stages[name]

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages.values())

    def holds(self, name: str) -> bool:
        return self.stages[name].held

    @property
    def held(self) -> list[Stage]:
        """The stages this rank runs, in config order (the order every engine call follows)."""
        return [s for s in self.stages.values() if s.held]

    @property
    def language(self) -> Stage:
        return self.stages[LANGUAGE]

    @property
    def encoders(self) -> list[Stage]:
        """Every stage that feeds the language stage through a boundary, in config order."""
        return [s for name, s in self.stages.items() if name != LANGUAGE]

    @property
    def boundary_group(self):
        """The group spanning every stage's ranks: the step's agreement, norms and losses use it."""
        return self.groups.boundary

    @property
    def training(self) -> list[Stage]:
        """The held stages that train (have an optimizer and step)."""
        return [s for s in self.held if s.trains]

    @property
    def stepping(self) -> list[Stage]:
        """The training stages that own their engine: each engine once (stages sharing one engine
        take one norm and one step)."""
        return [s for s in self.training if s.owns_engine]

    @contextlib.contextmanager
    def reduce_once(self) -> Iterator[None]:
        """Around a step's backward passes: a shared engine (stages/shared_engine.py) accumulates
        every pass's gradients with DeepSpeed's accumulation boundary held off, then reduces them
        in one `allreduce_gradients()` at the boundary. Nothing is reduced when the passes raise
        (no collective that a failed peer would not pair); the engine is then at the boundary
        again, as before the step."""
        owner = next((s for s in self.held if s.engine_owner is not None and s.owns_engine), None)
        if owner is None:
            yield
            return
        owner.engine.set_gradient_accumulation_boundary(False)
        try:
            yield
        finally:
            owner.engine.set_gradient_accumulation_boundary(True)  # the step that follows is the boundary
        with stage_context(owner.mpu):
            owner.engine.allreduce_gradients()

    def start_step(self, step: int) -> None:
        """Every held stage's model-parallel dropout streams restart from (seed, step)."""
        for stage in self.held:
            if stage.rng is not None:
                stage.rng.start_step(step)

    def modules(self) -> list[nn.Module]:
        """The modules of the held stages."""
        return [s.module for s in self.held]
