"""Models with several encoders (an image tower and an audio encoder feeding one LLM), for the planner.

    spec = multi_spec(config)         # None for a model with one encoder (model_spec.py covers those)
    spec.encoders                     # ((stage name, VisionSpec), ...) in the adapter's order
    spec.view("audio")                # a ModelSpec of that encoder + the language model

Every encoder is described by the same `VisionSpec` fields the single-encoder cost model reads
(tower width, layers, tokens in the tower per boundary row, attention span, embedding and
projector GEMMs), so flops.py, collectives.py, activations.py and memory.py price any encoder
through its `view` without knowing which modality it is. Parameter counts are computed from the
shapes by hand (tests/test_planner_encoders.py compares them with the model built on meta).

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

from dataclasses import dataclass
from typing import Any

from .model_spec import LanguageSpec, ModelSpec, VisionSpec, _get, _language, _qwen2_5_vl

AUDIO_KIND = "qwen2_5_omni_audio"


def audio_rows(frames: int) -> int:
    """Boundary rows of a clip of `frames` mel frames (the encoder's stride-2 conv, then stride-2 pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


@dataclass(frozen=True)
class MultiSpec:
    family: str
    encoders: tuple[tuple[str, VisionSpec], ...]
    language: LanguageSpec

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.encoders)

    def encoder(self, name: str) -> VisionSpec:
        return dict(self.encoders)[name]

    def view(self, name: str) -> ModelSpec:
        """The model as the single-encoder cost model sees it: this encoder, the language model."""
        return ModelSpec(self.family, self.encoder(name), self.language)

    def params(self) -> int:
        return sum(e.params() for _, e in self.encoders) + self.language.params()


def audio_spec(a: Any) -> VisionSpec:
    """The audio encoder of a Qwen2.5-Omni thinker config (`audio_config`) as encoder shapes."""
    d, n_mel, out = _get(a, "d_model"), _get(a, "num_mel_bins"), _get(a, "output_dim")
    layers = _get(a, "encoder_layers")
    return VisionSpec(
        kind=AUDIO_KIND, hidden=d, ffn=_get(a, "encoder_ffn_dim"), heads=_get(a, "encoder_attention_heads"),
        layers_forward=layers, layers_backward=layers,
        patch_in=2 * 3 * n_mel, stem_in=3 * d,  # conv1 over 2 frames per token; conv2
        tokens_per_image=0, merge=2, cls_tokens=0,  # rows vary with the clip: the workload sets them
        projector=((d, out),), projector_norm=2 * d, replicated_projector=True,
        embed_params=3 * n_mel * d + d + 3 * d * d + d,  # conv1, conv2 (with biases); sinusoid positions: a buffer
        window=_get(a, "n_window"), full_layers=0,
        layer_extra=-d,  # k_proj has no bias
        held=2 * out,  # audio_bos_eos_token
    )


def _thinker(cfg: Any) -> Any:
    """The thinker's config of a Qwen2.5-Omni config (the whole model's config holds it)."""
    return _get(cfg, "thinker_config") if str(_get(cfg, "model_type", "")) == "qwen2_5_omni" else cfg


def multi_spec(cfg: Any) -> MultiSpec | None:
    """The encoders and language model of a config with several encoders; None otherwise."""
    model_type = str(_get(cfg, "model_type", ""))
    if model_type not in ("qwen2_5_omni", "qwen2_5_omni_thinker"):
        return None
    thinker = _thinker(cfg)
    text = _get(thinker, "text_config")
    # the vision tower is Qwen2.5-VL's (windowed blocks, gated MLP, RMSNorms, merger)
    vision = _qwen2_5_vl({"vision_config": _get(thinker, "vision_config"), "text_config": text}).vision
    return MultiSpec("qwen2_5_omni", (("vision", vision), ("audio", audio_spec(_get(thinker, "audio_config")))),
                     _language(text, thinker))
