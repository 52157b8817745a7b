"""Shared pieces of the tensor-parallel tests: tiny models whose head counts tp 4 divides, and
comparisons of a sharded module against its unsharded reference (run inside worker ranks)."""

from __future__ import annotations

import copy

import torch

# Every head count, kv-head count and width is divisible by 4, so tp 1, 2 and 4 all apply.
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8)


def seeded(build, seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


def llama_lm(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    return seeded(lambda: LlamaForCausalLM(LlamaConfig(**{**TEXT, **overrides})))


def qwen2_lm(**overrides):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return seeded(lambda: Qwen2ForCausalLM(Qwen2Config(**{**TEXT, **overrides})))


def clip_tower():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return seeded(lambda: CLIPVisionModel(CLIPVisionConfig(**VISION)))


def siglip_tower():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return seeded(lambda: SiglipVisionModel(SiglipVisionConfig(**VISION)))


def llava_projector():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
    from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**VISION), text_config=LlamaConfig(**TEXT))
    return seeded(lambda: LlavaMultiModalProjector(cfg))


def llava(vision="clip"):
    from ds_hetero.toy import tiny_llava

    return tiny_llava(vision, text_heads=8, text_kv_heads=4, vision_heads=4)


QWEN_IMAGE, QWEN_START, QWEN_END = 299, 297, 296


def qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(TEXT, vocab_size=300, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
                bos_token_id=0, eos_token_id=1)  # mrope sections sum to head_dim / 2 = 4
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, in_chans=3, mlp_ratio=2)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=QWEN_IMAGE, video_token_id=298,
                        vision_start_token_id=QWEN_START, vision_end_token_id=QWEN_END, tie_word_embeddings=False)
    return seeded(lambda: Qwen2VLForConditionalGeneration(cfg))


def qwen_vision_inputs(seed=0):
    """Two images of 4x4 and 2x4 patches (16 + 8 patches, 4 + 2 merged tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(24, 3 * 2 * 4 * 4, generator=gen), torch.tensor([[1, 4, 4], [1, 2, 4]])


def qwen_vl_batch(seed=0, text_len=8):
    gen = torch.Generator().manual_seed(seed)
    pixels, grid = qwen_vision_inputs(seed)
    rows = []
    for n_img in (4, 2):
        text = torch.randint(2, 250, (text_len + 4 - n_img,), generator=gen)
        rows.append(torch.cat([torch.tensor([QWEN_START]), torch.full((n_img,), QWEN_IMAGE),
                               torch.tensor([QWEN_END]), text]))
    ids = torch.stack(rows)
    return {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": grid, "labels": ids,
            "mm_token_type_ids": (ids == QWEN_IMAGE).long()}


# ------------------------------------------------------------------------------ comparisons
def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    """max |a - b| / max(max |b|, floor): the error relative to the tensor's scale."""
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return (a - b).abs().max().item() / max(b.abs().max().item(), floor)


def param_errors(ref: torch.nn.Module, sharded: torch.nn.Module, group) -> dict:
    """Worst relative error of parameters and of their gradients, gathered back to full size.

    A gradient is judged against its own scale, except one whose reference is below 1e-6 of
    the model's largest gradient: those are exactly 0 in exact arithmetic and fp32 noise in
    practice (a key-projection bias: softmax ignores a shift shared by all keys; ~5e-8 next to
    grads of ~30), and noise divided by noise says nothing; they are judged against the model's
    largest gradient instead.
    """
    from ds_hetero.tensor_parallel import gather_full

    ref_params, params = dict(ref.named_parameters()), dict(sharded.named_parameters())
    grad_scale = max((r.grad.abs().max().item() for r in ref_params.values() if r.grad is not None), default=0.0)
    assert ref_params.keys() == params.keys(), set(ref_params) ^ set(params)
    worst_value, worst_grad, n_grads, n_sharded = 0.0, 0.0, 0, 0
    for name, p in params.items():
        r = ref_params[name]
        n_sharded += bool(getattr(p, "tensor_model_parallel", False))
        worst_value = max(worst_value, rel_err(gather_full(p, p, group), r.detach()))
        assert (p.grad is None) == (r.grad is None), f"{name}: grad presence differs"
        if p.grad is not None:
            analytic_zero = r.grad.abs().max().item() < 1e-6 * grad_scale
            floor = grad_scale if analytic_zero else 0.0
            worst_grad = max(worst_grad, rel_err(gather_full(p.grad, p, group), r.grad, floor))
            n_grads += 1
    return dict(value=worst_value, grad=worst_grad, n_grads=n_grads, n_sharded=n_sharded)


def gather_vocab(logits: torch.Tensor, head, group) -> torch.Tensor:
    """Full logits from vocab shards (tests only: the training path never does this)."""
    import torch.distributed as dist

    pieces = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, logits.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=-1)[..., : head.vocab_size]


def twin(build):
    """A reference model and an identical copy to shard."""
    ref = build()
    return ref, copy.deepcopy(ref)
