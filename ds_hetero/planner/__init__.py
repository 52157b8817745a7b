"""The planner: choose each stage's layout and the placement from a calibrated cost model.

    from ds_hetero.planner import plan, machine_profile
    p = plan("tiny-llava", world_size=4, seq_len=512, image_tokens=256, global_batch=16,
             machine=machine_profile("cpu"))
    p.best.candidate, p.ds_config()

A model with one encoder is the case of several with one (`plan(..., rows={"vision": 64, "audio": 50})`
for several). Pieces, one concept per file: model_spec (a model's shapes: models/shapes.py's
records, from its family's reader, families/<family>/shapes.py), workload, flops (GEMMs per
stage and rank), collectives (bytes of every collective per layout), machine (profiles and the
alpha-beta model), calibrate (measure this machine), boundary_cost (the boundary's own plan),
activations (per micro-batch), memory (per rank, ZeRO stage, micro-batches in flight), step_time
(a step from stage times per placement: colocated, 1F1B, first_stage), cost (a stage's times),
step_model (a candidate's prediction, every encoder through a view), candidate, validity (the
checks of validate/initialize), enumerate (candidates without a pipeline), modelled and extended
(pipeline, first_stage and the Megatron baseline, fewer passes, recompute, per-stage ZeRO),
verdicts and dominance (which of those the engine runs; which a lighter one beats), search
(rank), report (tables), trials (measured re-ranking through the runner the runtime hands in),
auto (`"hetero_parallel": "auto"`), cli (`ds-hetero plan`).
"""

from .calibrate import machine_profile
from .candidate import Candidate, StageChoice
from .cost import Prediction
from .step_model import predict
from .search import Plan, plan

__all__ = ["Candidate", "Plan", "Prediction", "StageChoice", "machine_profile", "plan", "predict"]
