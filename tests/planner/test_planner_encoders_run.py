"""The multi-encoder planner's picks run (4 ranks, one launch):

1. the config `ds-hetero plan --model tiny-qwen2.5-omni --write` writes (its best candidate) trains
   as the single-process Hugging Face thinker does: losses (the thinker's own `model(**batch).loss`),
   norms and weights within 1e-5 over 3 steps with clipping active; so does the config
   `--pp 2 --write` writes (the best candidate with a pipelined language stage, every encoder on
   ranks of its own: tests/planner/test_planner_encoders_pp.py checks the CLI writes this one);
2. `"hetero_parallel": {"auto": true, "rows": {"audio": ...}, ...}` with the thinker: rank 0 plans,
   every rank trains the same choice (the planner's top pick), and the loss goes down.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from ds_hetero.testing.parity import train_both

pytestmark = pytest.mark.distributed

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3
BASE = {"train_batch_size": 8, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
ROWS = {"vision": 16, "audio": 12}


def _suite(rank, world_size):
    import torch.distributed as dist

    import ds_hetero
    from ds_hetero.toy.omni_shapes import OmniShapesDataset
    from ds_hetero.toy import tiny_qwen2_5_omni
    from ds_hetero.planner.calibrate import machine_profile
    from ds_hetero.planner.search import plan

    out = {}
    # 1. the written pick (the same on every rank: planning is deterministic and needs no processes)
    result = plan("tiny-qwen2.5-omni", world_size, 96, None, 8, machine_profile("cpu"), base=BASE, rows=ROWS)
    section = result.ds_config()["hetero_parallel"]
    out["pick"] = section
    out["parity"] = train_both(rank, world_size, "omni", layout=section["stages"], zero_stage=1, steps=3, clip=CLIP,
                               placement=section["placement"], micro_batches=section["micro_batches"])
    dist.barrier()
    pp_pick = next(p for p in result.predictions if p.candidate.language.pp == 2)  # what `--pp 2` writes
    section = result.ds_config(pp_pick)["hetero_parallel"]
    out["pp pick"] = section
    out["pp parity"] = train_both(rank, world_size, "omni", layout=section["stages"], zero_stage=1, steps=3,
                                  clip=CLIP, placement=section["placement"], micro_batches=section["micro_batches"])
    dist.barrier()

    # 2. auto
    model = tiny_qwen2_5_omni(seed=3)
    data = OmniShapesDataset(64, model.config, seed=0)
    auto = {"train_batch_size": 8, "zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True}},
            "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0, "steps_per_print": 10**6,
            "hetero_parallel": {"auto": True, "seq_len": 96, "image_tokens": 16, "rows": {"audio": 12},
                                "machine": "cpu"}}
    engine = ds_hetero.initialize(model, auto, training_data=data)
    chosen = engine.config
    losses = [engine.train_batch().loss for _ in range(4)]
    out["auto"] = ({n: (s.tp, s.cp, s.dp, tuple(s.ranks)) for n, s in chosen.stages.items()}, chosen.placement,
                   chosen.micro_batches, losses)
    if rank == 0:
        from ds_hetero.planner.auto import plan_config

        cfg, _ = plan_config(model, auto, world_size)
        out["top"] = cfg["hetero_parallel"]
    del engine
    dist.barrier()
    return out


def test_planned_omni_configs_run_and_match_the_thinker():
    results = run_distributed(_suite, world_size=4, timeout=900, pg_timeout_s=300)
    assert results[0]["pp pick"]["stages"]["language"]["pp"] == 2
    for rank, out in enumerate(results):
        assert out["pick"] == results[0]["pick"] and out["pp pick"] == results[0]["pp pick"]
        for key in ("parity", "pp parity"):
            r = out[key]
            assert len(r["losses"]) == len(r["hf_losses"]) == 3
            for got, hf in zip(r["losses"], r["hf_losses"]):
                assert abs(got - hf) <= RTOL * abs(hf), (rank, key, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, key, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0 and err <= RTOL and abs_err <= ATOL, (rank, key, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound
        stages, placement, mb, losses = out["auto"]
        assert (stages, placement, mb) == results[0]["auto"][:3]  # every rank trains the same choice
        assert all(l == l and l < 20 for l in losses) and losses[-1] < losses[0], losses
    stages, placement, mb, _ = results[0]["auto"]
    top = results[0]["top"]
    assert placement == top["placement"] and mb == top["micro_batches"]
    assert set(stages) == set(top["stages"]) == {"vision", "audio", "language"}
    for name, (tp, cp, dp, ranks) in stages.items():
        assert (tp, dp) == (top["stages"][name]["tp"], top["stages"][name]["dp"]), name
