"""Parity runs for the Qwen2.5-VL and Gemma 3 adapters: ds_hetero against `model(**batch).loss`.

`train_family(rank, world_size, family, layout, ...)` runs inside every rank of a 4-rank job, as
tests/engine_parity.train_both does for LLaVA and Qwen2-VL: the same seeded tiny model trained
through `ds_hetero.initialize` on the given layout and as a plain single-process Hugging Face
model on the same global batches (same optimizer, same clipping); the reference's loss is the
fused model's own. `wrong=True` also trains a deliberately wrong reference (Qwen2.5-VL with its
attention windows dropped; Gemma 3 without its bidirectional image blocks; Qwen3-VL with its
DeepStack levels routed to the wrong decoder layers; Qwen3.5 with its Gated DeltaNet key heads swapped,
so each value head reads another key head's q and k; InternVL with its pixel shuffle transposed; LLaVA-OneVision with each image's
tiles in reverse order) whose weights must
end far from the engine's: the comparison can fail on exactly what the family adds.
"""

import copy

import torch

from ds_hetero.testing.parity import full_named_parameters, max_rel_err
from tests.helpers.family_data import (QWEN25_GRIDS, gemma3_samples, internvl_samples, onevision_model_inputs,
                               qwen_multi_samples)
from ds_hetero.testing.batches import qwen_samples

FAMILIES = ("qwen2_5_vl", "gemma3", "qwen3_vl", "internvl", "llava_onevision", "qwen3_5")
QWEN = ("qwen2_5_vl", "qwen3_vl", "qwen3_5")  # Qwen2-VL's sample format


def build_model(family, seed, **model_kw):
    from ds_hetero import toy as tiny_families

    return getattr(tiny_families, f"tiny_{family}")(seed=seed, **model_kw)


def make_batches(family, model, steps, batch_size, seed=100):
    """Variable images per sample, text-only samples in every batch, one several-image sample."""
    batches = []
    for step in range(steps):
        if family in QWEN:
            grids = (QWEN25_GRIDS * 2)[step % 4: step % 4 + batch_size - 1]
            samples = qwen_samples(model, grids, text_len=4 + step % 3, seed=seed + step)
            samples += qwen_multi_samples(model, [[(1, 8, 8), (1, 4, 4)]], seed=seed + 50 + step)
        elif family == "llava_onevision":  # the processor's own output: any-resolution, several images, none
            from tests.helpers.family_processors import llava_onevision_processor, processor_samples

            texts = [("w5 <image> w6 w7", 1), ("w8 w9 w10", 0), ("<image> w11 <image> w12", 2), ("w13 <image>", 1)]
            texts = (texts * 4)[step % 3: step % 3 + batch_size]
            samples = processor_samples(llava_onevision_processor(model), texts, model.config.image_token_id,
                                        seed=seed + step)
        elif family == "internvl":  # tiles per image: dynamic tiling gives images of 1-3 tiles
            tiles = ([[2, 1], [], [1], [3], [1, 1], [], [2], [1]] * 2)[step % 3: step % 3 + batch_size]
            samples = internvl_samples(model, tiles, text_len=4 + step % 3, seed=seed + step)
        else:
            counts = ([2, 0, 1, 3, 1, 0, 2, 1] * 2)[step % 3: step % 3 + batch_size]
            samples = gemma3_samples(model, counts, text_len=5 + step % 3, seed=seed + step)
        batches.append(samples)
    return batches


def reference_loss(family, model, adapter, samples, wrong=False):
    """The fused model's own loss (mean over label tokens) on the padded batch."""
    batch = adapter.language_inputs(samples)
    vision = adapter.vision_inputs(samples)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if family in QWEN:
        has = len(vision["image_grid_thw"]) > 0
        return model(input_ids=ids, attention_mask=mask, labels=batch["labels"],
                     pixel_values=vision["pixel_values"] if has else None,
                     image_grid_thw=vision["image_grid_thw"] if has else None,
                     mm_token_type_ids=(ids == model.config.image_token_id).int()).loss
    has = len(vision["pixel_values"]) > 0
    if family == "llava_onevision":
        return model(input_ids=ids, attention_mask=mask, labels=batch["labels"],
                     **onevision_model_inputs(adapter, samples, model.dtype, wrong)).loss
    if family == "internvl":
        return model(input_ids=ids, attention_mask=mask, labels=batch["labels"],
                     pixel_values=vision["pixel_values"] if has else None).loss
    # wrong: no token_type_ids, so Gemma3Model builds plain causal masks (no image blocks)
    token_types = None if wrong else (ids == model.config.image_token_id).long()
    return model(input_ids=ids, attention_mask=mask, labels=batch["labels"], token_type_ids=token_types,
                 pixel_values=vision["pixel_values"] if has else None).loss


def swap_deltanet_key_heads(model):
    """Reverse the key heads' order in every Gated DeltaNet layer's q and k (a forward hook on
    in_proj_qkv): what a head split that loses the key-to-value head pairing computes."""
    for module in model.modules():
        if type(module).__name__ != "Qwen3_5GatedDeltaNet":
            continue

        def hook(_, __, out, m=module):
            q, k, v = out.split([m.key_dim, m.key_dim, m.value_dim], -1)
            flip = lambda t: t.unflatten(-1, (m.num_k_heads, -1)).flip(-2).flatten(-2)  # noqa: E731
            return torch.cat([flip(q), flip(k), v], -1)

        module.in_proj_qkv.register_forward_hook(hook)


def reference_train(family, model, batches, make_optimizer, clip, wrong=False):
    from ds_hetero.families import adapter_for

    if wrong and family == "qwen2_5_vl":  # every block full attention: the window mask dropped
        model.model.visual.fullatt_block_indexes = list(range(model.config.vision_config.depth))
    if wrong and family == "qwen3_vl":  # DeepStack levels routed to the wrong decoder layers
        model.model.visual.deepstack_visual_indexes = model.model.visual.deepstack_visual_indexes[::-1]
    if wrong and family == "qwen3_5":  # each Gated DeltaNet value head paired with the wrong key head
        swap_deltanet_key_heads(model)
    if wrong and family == "internvl":  # pixel shuffle over transposed tiles: rows in the wrong order
        shuffle = model.model.pixel_shuffle
        model.model.pixel_shuffle = lambda f, scale_factor: shuffle(f.transpose(1, 2).contiguous(), scale_factor)
    adapter = adapter_for(model)
    opt = make_optimizer(list(model.parameters()))
    losses, norms = [], []
    for samples in batches:
        loss = reference_loss(family, model, adapter, samples, wrong)
        loss.backward()
        losses.append(float(loss))
        params = [p for p in model.parameters() if p.grad is not None]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, norms


def train_family(rank, world_size, family, layout, zero_stage, steps, clip, optimizer="adamw", micro_batches=2,
                 batch_size=8, placement="colocated", hetero=None, wrong=False, model_kw=None, evaluate=False,
                 inspect=None):
    """`model_kw`: arguments of the tiny model's builder; `evaluate`: also `eval_batch` on the first
    batch before training (`eval_loss`, to compare with the reference's first loss); `inspect(engine)`
    -> more result entries (it runs before training, its dict is read after)."""
    import ds_hetero

    lr = 1e-3 if optimizer == "adamw" else 0.5

    def make_optimizer(params):  # eps 1e-4: see tests/engine_parity.py
        if optimizer == "adamw":
            return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.01)
        return torch.optim.SGD(params, lr=lr)

    config = {
        "train_batch_size": batch_size, "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True, "gradient_clipping": clip, "steps_per_print": 10**6,
        "hetero_parallel": {"placement": placement, "micro_batches": micro_batches, "stages": layout,
                            **(hetero or {})},
    }
    model = build_model(family, seed=7, **(model_kw or {}))
    reference = copy.deepcopy(model)
    batches = make_batches(family, model, steps, batch_size)
    engine = ds_hetero.initialize(model, config, optimizer=make_optimizer)
    extra = inspect(engine) if inspect is not None else {}
    eval_loss = engine.eval_batch(batches[0]) if evaluate else None
    results = [engine.train_batch(samples) for samples in batches]
    got = full_named_parameters(engine)
    ref_losses, ref_norms = reference_train(family, reference, batches, make_optimizer, clip)
    out = {
        "losses": [r.loss for r in results], "ref_losses": ref_losses, "hf_losses": ref_losses,
        "norms": [r.grad_norm for r in results], "ref_norms": ref_norms,
        "weight_err": max_rel_err(got, {n: p.detach() for n, p in reference.named_parameters()}),
        "boundary": [(r.boundary_bytes_total, r.boundary_bytes_lower_bound) for r in results],
        "row_bytes": engine.adapter.hidden_size * 4,  # fp32 rows; Qwen3-VL: merged + every DeepStack level
        **extra,
    }
    if evaluate:
        out["eval_loss"] = eval_loss
    if wrong:
        bad = build_model(family, seed=7, **(model_kw or {}))
        bad_losses, _ = reference_train(family, bad, batches, make_optimizer, clip, wrong=True)
        out["wrong_weights"] = max_rel_err(got, {n: p.detach() for n, p in bad.named_parameters()})
        out["wrong_losses"] = bad_losses
    engine.groups.destroy()
    return out
