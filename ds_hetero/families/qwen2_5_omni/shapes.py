"""The planner's shapes of the Qwen2.5-Omni thinker (vision: Qwen2.5-VL's tower; audio; language), read
from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.

Qwen2.5-Omni's audio encoder (Whisper-like, `Qwen2_5OmniAudioEncoder`), per boundary row:

    frames      a clip of F mel frames gives rows(F) = ((F - 1) // 2 + 1 - 2) // 2 + 1 rows
                (conv2 has stride 2, the pooling after the blocks stride 2): about 4 frames a row
    tower       2 tokens per row (merge = 2), attention within chunks of n_window tokens (the
                encoder cuts the clip into chunks of 2 n_window frames before its convolutions)
    embedding   conv1 (kernel 3, n_mel -> d) on the 2 frames of each tower token: a GEMM of
                6 n_mel inputs per token without input gradient (mel features); conv2 (kernel 3,
                d -> d, stride 2): a GEMM of 3 d inputs per token, with input gradient (`stem_in`)
    layers      q, k, v, out (k without bias), fc1, fc2 (GELU), two LayerNorms
    projector   ln_post, pooling, `proj` (d -> output_dim): not split by the tp plan (replicated)
    held        `audio_bos_eos_token` (2 x output_dim): the thinker's forward never uses it
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, language_shapes
from ..qwen2_5_vl.shapes import shapes as qwen2_5_vl


AUDIO_KIND = "qwen2_5_omni_audio"


def audio_rows(frames: int) -> int:
    """Boundary rows of a clip of `frames` mel frames (the encoder's stride-2 conv, then stride-2 pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_spec(a: Any) -> EncoderSpec:
    """The audio encoder of a Qwen2.5-Omni thinker config (`audio_config`) as encoder shapes."""
    d, n_mel, out = get(a, "d_model"), get(a, "num_mel_bins"), get(a, "output_dim")
    layers = get(a, "encoder_layers")
    return EncoderSpec(
        kind=AUDIO_KIND, hidden=d, ffn=get(a, "encoder_ffn_dim"), heads=get(a, "encoder_attention_heads"),
        layers_forward=layers, layers_backward=layers,
        patch_in=2 * 3 * n_mel, stem_in=3 * d,  # conv1 over 2 frames per token; conv2
        tokens_per_image=0, merge=2, cls_tokens=0,  # rows vary with the clip: the workload sets them
        projector=((d, out),), projector_norm=2 * d, replicated_projector=True,
        embed_params=3 * n_mel * d + d + 3 * d * d + d,  # conv1, conv2 (with biases); sinusoid positions: a buffer
        window=get(a, "n_window"), full_layers=0,
        layer_extra=-d,  # k_proj has no bias
        held=2 * out,  # audio_bos_eos_token
    )


def thinker(cfg: Any) -> Any:
    """The thinker's config of a Qwen2.5-Omni config (the whole model's config holds it)."""
    return get(cfg, "thinker_config") if str(get(cfg, "model_type", "")) == "qwen2_5_omni" else cfg


def shapes(cfg: Any) -> ModelSpec:
    """The Qwen2.5-Omni thinker (a whole Omni config or the thinker's): vision, audio, language."""
    think = thinker(cfg)
    text = get(think, "text_config")
    # the vision tower is Qwen2.5-VL's (windowed blocks, gated MLP, RMSNorms, merger)
    vision = qwen2_5_vl({"vision_config": get(think, "vision_config"), "text_config": text}).vision
    return ModelSpec("qwen2_5_omni", (("vision", vision), ("audio", audio_spec(get(think, "audio_config")))),
                     language_shapes(text, think))


SHAPES = {"qwen2_5_omni": shapes, "qwen2_5_omni_thinker": shapes}
