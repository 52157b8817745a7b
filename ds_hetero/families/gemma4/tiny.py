"""A tiny Gemma 4 (`Gemma4ForConditionalGeneration`: vision tower, conformer audio tower, decoder) from
config, seeded random weights; no download.

It switches on what the family adds, so the tests see each of them: variable-resolution images pooled
2x2 (a 16x16 image of 4x4-pixel patches gives 4 soft tokens, 8x16 gives 2), clippable linears with finite
bounds in both towers (the clamps act), the vision tower's standardisation, the conformer's chunked local
attention and causal depthwise conv, the decoder's sliding and full layers (the full ones with their own
head_dim, keys reused as values: `attention_k_eq_v`), the last two layers reusing the keys and values of
earlier ones (`num_kv_shared_layers`), per-layer embeddings (`hidden_size_per_layer_input`),
bidirectional attention inside each image on the sliding layers, a final logit softcap, and, with
`moe=True`, the MoE block next to the dense MLP in every layer (`enable_moe_block`).
"""

from __future__ import annotations

import random

import torch

GEMMA4_IDS = dict(boi_token_id=290, eoi_token_id=291, image_token_id=299, video_token_id=298, boa_token_id=292,
                  eoa_token_index=293, audio_token_id=297)


def _set_clip_bounds(model, seed: int, bounds: tuple[float, float]) -> None:
    """Finite input/output bounds on every clippable linear (a checkpoint carries them; init gives
    +-inf), `bounds` standard deviations of what each sees (inputs: normalised, about 1; outputs of the
    0.02-initialised linears: about 0.1). The default (3, 4) clamps a few activations: tight bounds
    clamp so many that a 1e-7 change of the initial weights changes the fifth step's gradient norm by
    1e-4 (which elements are clamped flips), and a training comparison measures that, not the engine
    (tests/families/test_families_gemma4.py checks the sharded clamps with tight bounds layer by layer).
    Drawn on the host: the model may be on the meta device (`ds-hetero validate`)."""
    draw = random.Random(seed)
    for name, buf in model.named_buffers():
        scale = 1.0 if "input" in name.rsplit(".", 1)[-1] else 0.1
        if name.endswith(("input_min", "output_min")):
            buf.fill_(-scale * draw.uniform(*bounds))
        elif name.endswith(("input_max", "output_max")):
            buf.fill_(scale * draw.uniform(*bounds))


def tiny_gemma4(seed: int = 0, text_hidden: int = 64, text_layers: int = 4, vision_hidden: int = 32,
                vision_layers: int = 2, audio_hidden: int = 32, audio_layers: int = 2, n_mel: int = 16,
                moe: bool = False, num_experts: int = 4, top_k: int = 2, kv_shared_layers: int = 2,
                per_layer_hidden: int = 8, tie_word_embeddings: bool = False, softcap: float | None = 10.0,
                clip_bounds: tuple[float, float] = (3.0, 4.0)):
    """A Gemma 4 with a 300-token vocab and an untied head (a vocabulary-parallel head needs it unless
    `tie_word_embeddings`); layers alternate sliding (window 4) and full; 4 heads, 2 kv heads.

    Gemma initialises its norm and scale weights to ones and the experts' router scales to one; here
    every norm weight, the routers' scales and the layer scalars are drawn at random too, so each
    carries a gradient (or an effect) from step one (the q / k norms around 0.5: see below)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(text_layers)]
    text = dict(
        vocab_size=300, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=text_hidden // 4, global_head_dim=text_hidden // 2,
        num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=4, layer_types=layer_types,
        max_position_embeddings=1024, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        tie_word_embeddings=tie_word_embeddings, use_bidirectional_attention="vision",
        vocab_size_per_layer_input=300, hidden_size_per_layer_input=per_layer_hidden,
        num_kv_shared_layers=kv_shared_layers, final_logit_softcapping=softcap,
        enable_moe_block=moe, num_experts=num_experts if moe else None, top_k_experts=top_k if moe else None,
        moe_intermediate_size=text_hidden // 4 if moe else None,
    )
    vision = dict(
        hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
        num_attention_heads=4, num_key_value_heads=4, head_dim=vision_hidden // 4, patch_size=4,
        pooling_kernel_size=2, position_embedding_size=64, use_clipped_linears=True, standardize=True,
    )
    audio = dict(
        hidden_size=audio_hidden, num_hidden_layers=audio_layers, num_attention_heads=4,
        subsampling_conv_channels=[n_mel, 4], conv_kernel_size=3, attention_chunk_size=4, attention_context_left=5,
        attention_context_right=0, output_proj_dims=48, use_clipped_linears=True,
    )
    cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio,
                       tie_word_embeddings=tie_word_embeddings, **GEMMA4_IDS)
    cfg._attn_implementation = "eager"
    for sub in (cfg.text_config, cfg.vision_config, cfg.audio_config):
        sub._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Gemma4ForConditionalGeneration(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    # Gemma 4 does not scale its attention logits (scaling 1): unit q / k norm weights give
                    # logits of std sqrt(head_dim), a saturated softmax whose fp32 gradients are noise-prone
                    p.normal_(0.5, 0.05)
                elif name.endswith(("norm.weight", "layernorm.weight", "router.scale", "per_expert_scale")):
                    p.normal_(1.0, 0.2)
                elif name.endswith("per_dim_scale"):
                    p.normal_(0.0, 0.5)
                elif name.endswith("position_embedding_table"):  # init: ones, every position alike
                    p.normal_(0.0, 0.5)
                elif name.endswith("per_layer_model_projection.weight"):
                    # the decoder scales this projection by hidden^-0.5 before an RMSNorm over the small
                    # per-layer width: at the 0.02 init its output is ~3e-3, and the norm amplifies the
                    # gradient (and its fp32 noise) back into the embeddings ~300 times
                    p.normal_(0.0, 1.0)
                elif name.endswith(".bias"):  # init: zeros (a zero tensor's error is judged on a floor)
                    p.normal_(0.0, 0.02)
            for name, buf in model.named_buffers():
                if name.endswith("layer_scalar"):
                    buf.uniform_(0.5, 1.5)
                elif name.endswith("std_bias"):
                    buf.normal_(0.0, 0.1)
                elif name.endswith("std_scale"):
                    buf.uniform_(0.5, 1.5)
            _set_clip_bounds(model, seed, clip_bounds)
        return model
