"""The distributed cases of tests/parallel/test_lora_dropout.py (one 4-rank launch, gloo CPU ranks, fp32).

    masks     tiny LLaVA, LoRA (dropout 0.1) on every linear of the tower and the decoder, vision tp2 dp2 +
              language tp2 dp2, 2 steps: a digest of every dropout mask each rank drew in training, and
              one same-shape draw from every stage stream afterwards
    layer     a column- and a row-parallel LoRA pair (dropout 0.3) under tp2 (x2 dp) against the unsharded
              PEFT pair with the masks the tp ranks drew: output and every gradient
    curve     20 steps with dropout 0.05 (vision dp4 + language tp2 dp2) and, on rank 0, the stock
              single-process PEFT run with the same dropout under several seeds, and two controls
"""

import copy
import hashlib

import torch
import torch.distributed as dist
from torch import nn

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj", "down_proj", "fc1", "fc2"]
BATCH, CLIP = 8, 1.0


def _optimizer(params, lr=1e-3):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)


def lora_llava(dropout: float, seed: int = 7, r: int = 4):
    from peft import LoraConfig, get_peft_model

    from ds_hetero.toy import tiny_llava

    base = tiny_llava("clip", seed=seed, text_heads=4, text_kv_heads=4)
    torch.manual_seed(11)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, lora_dropout=dropout, init_lora_weights=False)
    return get_peft_model(base, config)


def _engine(peft, stages, optimizer=_optimizer):
    import ds_hetero

    config = {"train_batch_size": BATCH, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": CLIP, "steps_per_print": 10**6,
              "hetero_parallel": {"micro_batches": 2, "stages": stages}}
    return ds_hetero.initialize(peft, config, optimizer=optimizer)


def _digest(mask: torch.Tensor) -> str:
    return hashlib.sha1(mask.bool().numpy().tobytes() + str(tuple(mask.shape)).encode()).hexdigest()[:16]


def masks(rank, world_size):
    """Per stage: this rank's coordinate, and per dropout module the digests of the masks it drew."""
    from ds_hetero.testing.parity import make_batches
    from ds_hetero.tensor_parallel.lora_dropout import TensorParallelDropout

    peft = lora_llava(0.1)
    batches = make_batches("llava", peft.get_base_model(), 2, BATCH)
    engine = _engine(peft, {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}})
    drawn, dropped = {}, [0, 0]

    def record(name):
        def hook(module, args, out):
            keep = out != 0  # the inputs are activations: none is exactly 0
            drawn.setdefault(name, []).append(_digest(keep))
            dropped[0] += int((~keep).sum())
            dropped[1] += keep.numel()
        return hook

    report = {}
    for stage in engine.stages.held:
        mods = {n: m for n, m in stage.module.named_modules() if isinstance(m, TensorParallelDropout)}
        for n, m in mods.items():
            m.register_forward_hook(record(f"{stage.name}:{n}"))
        report[stage.name] = {"coord": list(stage.coord), "modules": {f"{stage.name}:{n}": m.sharded
                                                                      for n, m in mods.items()}}
    for b in batches:
        engine.train_batch(b)
    same_shape = {}
    for stage in engine.stages.held:
        stage.rng.start_step(5)
        for sharded in (False, True):
            g = stage.rng.generator(torch.device("cpu"), sharded)
            same_shape[f"{stage.name}:{sharded}"] = _digest(torch.empty(64, 32).bernoulli_(0.9, generator=g))
    return {"stages": report, "drawn": drawn, "dropped": dropped, "same_shape": same_shape}


class Pair(nn.Module):
    """x -> up (column-parallel under tp) -> down (row-parallel): the shape of an MLP without its activation."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.up(x))


class FixedMask(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, x):
        return x * self.mask


def _lora_grads(model, group):
    from ds_hetero.tensor_parallel.layers import gather_full

    return {n: gather_full(p.grad, p, group) for n, p in model.named_parameters() if "lora_" in n}


def layer(rank, world_size):
    """{"errors": max|sharded - reference| / max|reference| of the output and every gradient, "controls": the same
    against deliberately wrong references (no dropout; this rank's row mask taken as the whole mask)}."""
    from peft import LoraConfig, inject_adapter_in_model

    from ds_hetero.comm import copy_to_region
    from ds_hetero.tensor_parallel.lora import shard_lora_column, shard_lora_row
    from ds_hetero.tensor_parallel.lora_dropout import TensorParallelDropout, install_lora_dropout
    from ds_hetero.tensor_parallel.rng import StageRNG
    from ds_hetero.layout import Coord

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank builds every group
    group, tp, dp = groups[rank // 2], rank % 2, rank // 2
    torch.manual_seed(0)
    model = inject_adapter_in_model(LoraConfig(r=4, target_modules=["up", "down"], lora_dropout=0.3,
                                               init_lora_weights=False), Pair())
    reference = copy.deepcopy(model)
    shard_lora_column(model.up, group)
    shard_lora_row(model.down, group)
    rng = StageRNG(5, "pair", Coord(tp=tp, cp=0, dp=dp))
    assert install_lora_dropout(model, rng) == 2
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(dp))  # the dp rank's data
    w = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(10 + dp))
    before = rng.snapshot()
    xs = x.clone().requires_grad_()
    y = model(copy_to_region(xs, group))
    (y * w).sum().backward()
    rng.restore(before)  # the same draws again, on ones: the masks (scaled) the layers applied
    up_mask = TensorParallelDropout(0.3, rng, False)(torch.ones(3, 5, 8))
    down_mine = TensorParallelDropout(0.3, rng, True)(torch.ones(3, 5, 8))
    pieces = [torch.empty_like(down_mine) for _ in range(2)]
    dist.all_gather(pieces, down_mine, group=group)
    down_mask = torch.cat(pieces, -1)

    def against(up, down):
        ref = copy.deepcopy(reference)
        ref.up.lora_dropout["default"], ref.down.lora_dropout["default"] = FixedMask(up), FixedMask(down)
        xr = x.clone().requires_grad_()
        yr = ref(xr)
        (yr * w).sum().backward()
        got, want = _lora_grads(model, group), {n: p.grad for n, p in ref.named_parameters() if "lora_" in n}
        pairs = [(got[n], want[n], n) for n in want]
        pairs += [(y.detach(), yr.detach(), "output"), (xs.grad, xr.grad, "input_grad")]
        errs = {n: float((a - b).abs().max() / b.abs().max()) for a, b, n in pairs}  # relative to the tensor
        return errs

    return {"errors": against(up_mask, down_mask),
            "controls": {"no dropout": against(torch.ones_like(up_mask), torch.ones_like(down_mask)),
                         "own row mask": against(up_mask, torch.cat([down_mine, down_mine], -1))},
            "kept": float((up_mask != 0).float().mean())}


def curve(rank, world_size, steps=20, dropout=0.05, seeds=(0, 1, 2, 3), lr=3e-3):
    """ds_hetero's losses on the shapes captions (a learnable task: the loss falls from 5.57 to about 5.1);
    on rank 0 the stock single-process PEFT curves with the same dropout, one per seed, and two
    deliberately different trainings (controls): lr x 2, and dropout 0.5."""
    import functools

    from ds_hetero.toy.shapes import ShapesCaptionDataset
    from ds_hetero.testing.parity import reference_train

    optimizer = functools.partial(_optimizer, lr=lr)
    peft = lora_llava(dropout, r=8)
    reference = copy.deepcopy(peft)
    data = ShapesCaptionDataset.for_llava(peft.get_base_model().config, steps * BATCH, seed=0)
    batches = [[data[step * BATCH + i] for i in range(BATCH)] for step in range(steps)]
    engine = _engine(peft, {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, optimizer)
    report = {"losses": [engine.train_batch(b).loss for b in batches]}
    if rank != 0:
        return report

    def stock(seed, p=dropout, make_optimizer=optimizer):
        model = copy.deepcopy(reference).get_base_model().train()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
        torch.manual_seed(1000 + seed)  # PEFT's nn.Dropout draws from torch's default generator
        return reference_train("llava", model, batches, make_optimizer, CLIP)[0]

    report.update(stock={s: stock(s) for s in seeds},
                  controls={"lr x 2": stock(9, make_optimizer=functools.partial(_optimizer, lr=2 * lr)),
                            "dropout 0.5": stock(9, p=0.5)})
    return report


def recompute(rank, world_size, steps=2):
    """Losses and grad norms of the same dropout run (0.1, vision tp2 dp2 + language tp2 dp2) without
    recompute, with `recompute: true` on both stages, and with recompute but the streams not restored
    for it (the control: StageRNG.checkpoint_contexts replaced by no-op contexts while it runs)."""
    import contextlib

    from ds_hetero.tensor_parallel.rng import StageRNG
    from ds_hetero.testing.parity import make_batches

    def run(on):
        peft = lora_llava(0.1)
        batches = make_batches("llava", peft.get_base_model(), steps, BATCH)
        stages = {"vision": {"tp": 2, "dp": 2, "recompute": on}, "language": {"tp": 2, "dp": 2, "recompute": on}}
        engine = _engine(peft, stages)
        results = [engine.train_batch(b) for b in batches]
        engine.groups.destroy()
        return {"losses": [r.loss for r in results], "norms": [r.grad_norm for r in results]}

    out = {"plain": run(False), "recompute": run(True)}
    original = StageRNG.checkpoint_contexts
    StageRNG.checkpoint_contexts = lambda self: (contextlib.nullcontext(), contextlib.nullcontext())
    try:
        out["not restored"] = run(True)
    finally:
        StageRNG.checkpoint_contexts = original
    return out
