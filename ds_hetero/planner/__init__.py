"""The planner: choose each stage's layout and the placement from a calibrated cost model.

    from ds_hetero.planner import plan, machine_profile
    p = plan("tiny-llava", world_size=4, seq_len=512, image_tokens=256, global_batch=16,
             machine=machine_profile("cpu"))
    p.best.candidate, p.ds_config()

Pieces, one concept per file: model_spec (shapes from the HF config), workload, flops (GEMMs
per stage and rank), collectives (bytes of every collective per layout), machine (profiles and
the alpha-beta model), calibrate (measure this machine), boundary_cost (the boundary's own
plan), activations (per micro-batch), memory (per rank, ZeRO stage, micro-batches in flight),
pipeline / pipeline_pp (colocated, 1F1B, first_stage steps), cost (a stage's times), step_model
(a candidate's prediction), candidate, validity (the checks of validate/initialize), enumerate
(candidates without a pipeline), modelled (pipeline, first_stage and the Megatron baseline,
recompute, per-stage ZeRO), verdicts (which of those the engine runs),
search (rank), report (tables), trials (measured re-ranking), auto (`"hetero_parallel": "auto"`).
"""

from .calibrate import machine_profile
from .candidate import Candidate, StageChoice
from .cost import Prediction
from .step_model import predict
from .search import Plan, plan

__all__ = ["Candidate", "Plan", "Prediction", "StageChoice", "machine_profile", "plan", "predict"]
