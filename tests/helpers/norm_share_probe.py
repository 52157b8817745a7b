"""Records, every step of a train_both run, each stage's gradient norm three ways: DeepSpeed's own
(`clipping.stage_norm`, with its dp and model-parallel all-reduces), the sum of the ranks' shares
that the engine now uses (optimizer_step/norm_shares.py), and a negative control: shares that
count the tensor-parallel replicas of a replicated parameter on every tp rank (what a share
without DeepSpeed's `model_parallel_rank == 0` filter would sum)."""

import math


class NormShareProbe:
    """`inspect` and `after` hooks for ds_hetero.testing.parity.train_both (colocated layouts:
    every rank holds every stage, so the shares are summed over the boundary group)."""

    def __init__(self):
        self.steps = []
        self._restore = None

    def inspect(self, engine, batches):
        import torch
        import torch.distributed as dist

        from ds_hetero.optimizer_step import clipping, global_step, norm_shares

        original = global_step.stage_norms

        def probed(stages, sharing=frozenset()):
            norms = original(stages, sharing)
            record = {}
            for stage in stages.training:
                if stage.name not in sharing:
                    continue
                opt = stage.engine.optimizer
                with stage.context():
                    deepspeed_norm = float(clipping.stage_norm(stage.engine, stage.groups.tp))
                    share = norm_shares.norm_sq_share(opt)
                    saved, opt.model_parallel_rank = opt.model_parallel_rank, 0
                    try:
                        every_tp_rank = norm_shares.norm_sq_share(opt)
                    finally:
                        opt.model_parallel_rank = saved
                sums = torch.stack([share, every_tp_rank]).double()
                dist.all_reduce(sums, group=stages.boundary_group)
                record[stage.name] = (deepspeed_norm, math.sqrt(sums[0]), math.sqrt(sums[1]))
            self.steps.append(record)
            return norms

        global_step.stage_norms = probed
        self._restore = lambda: setattr(global_step, "stage_norms", original)
        return {"norm_shares": self.steps, "sharing": sorted(engine.norm_sharing)}

    def after(self, engine, initial, got, results):
        self._restore()
        return {}
