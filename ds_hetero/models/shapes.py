"""The shapes the cost model needs: plain records of a model's encoders and language model.

    spec = model_spec(config)          # planner/model_spec.py: the family's reader (families/<family>/shapes.py)
    spec.encoders                      # ((stage name, EncoderSpec), ...) in the adapter's order
    spec.view("audio")                 # that encoder + the language model, as the cost model prices them

An `EncoderSpec` describes an encoder and its projector per image (or clip), a `LanguageSpec` the
decoder and head per token. Parameter counts are computed from the shapes by hand (the tests
compare them with a model built on the meta device), so a 70B config costs nothing to plan. This
module depends on nothing: each family's reader (families/<family>/shapes.py) returns these records
and the planner prices them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


def get(cfg: Any, key: str, default: Any = None) -> Any:
    """A key of an HF config, given as the config object or its dict."""
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)



@dataclass(frozen=True)
class EncoderSpec:
    """An encoder (a ViT tower, an audio encoder) plus its projector.

    kind               "clip", "siglip", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision" or "gemma3" (SigLIP + pooling)
    tokens_per_image   image tokens one image gives the language model (LLaVA: fixed by the
                       image size; Qwen2-VL: variable, set by the planner's --image-tokens)
    seq_per_image      tokens inside the tower per image (CLIP adds a CLS token; Qwen2-VL sees
                       spatial_merge^2 patches per image token). Attention is full over one
                       image in both families: LLaVA's CLIP/SigLIP and Qwen2-VL's tower (which
                       has no windowed attention, unlike Qwen2.5-VL) attend within an image.
    layers_forward     layers the forward runs (HF runs the whole tower even when LLaVA takes
                       an earlier layer's output)
    layers_backward    layers a gradient reaches (up to LLaVA's deepest feature layer)
    patch_in           inputs of the patch embedding per tower token (channels x patch area
                       [x temporal patch])
    projector          (in, out) of each linear applied per image token after the tower
                       (LLaVA: linear_1, linear_2; Qwen2-VL merger: mlp.0, mlp.2; Gemma 3: one
                       bias-free projection, replicated over tp)
    merge              tower tokens per image token: Qwen's spatial_merge^2, InternVL-style
                       pixel shuffle, Gemma 3's pooling kernel^2 (the tower works per patch,
                       the boundary per merged token)
    window             tower tokens one windowed attention block attends over (Qwen2.5-VL);
                       0 = every block attends over the whole image
    full_layers        with a window: how many blocks still attend over the whole image
    gated_mlp          gate/up/down MLP (Qwen2.5-VL) instead of fc1/fc2
    rms_norms          RMSNorms (weight only) instead of LayerNorms (weight and bias)
    projector_norm     parameters of the norms before the projector(s) (Qwen merger ln_q, Gemma 3
                       mm_soft_emb_norm, Qwen3-VL's merger and DeepStack merger LayerNorms)
    deepstack          Qwen3-VL: DeepStack mergers (each the projector's linears again); the
                       boundary then carries 1 + deepstack row tensors per image token
    """

    kind: str
    hidden: int
    ffn: int
    heads: int
    layers_forward: int
    layers_backward: int
    patch_in: int
    tokens_per_image: int
    merge: int  # tower tokens per image token (Qwen2-VL spatial_merge_size^2; 1 for LLaVA)
    cls_tokens: int  # extra tower tokens per image (CLIP's CLS)
    projector: tuple[tuple[int, int], ...]
    embed_params: int  # patch embedding, position embeddings, CLS, pre-norm
    window: int = 0
    full_layers: int = 0
    gated_mlp: bool = False
    rms_norms: bool = False
    projector_norm: int = 0
    deepstack: int = 0
    layer_extra: int = 0  # per-layer parameters beyond the formula (InternViT: layer scales, no q/k/v biases)
    stem_in: int = 0  # a second embedding GEMM per tower token, [stem_in -> hidden], with input gradient
    #                   (an audio encoder's second convolution: families/qwen2_5_omni/shapes.py)
    held: int = 0  # parameters held but never trained, beyond the unused tail (an audio encoder's bos/eos)
    replicated_projector: bool = False  # the projector is not split over tp (every tp rank holds it whole)

    @property
    def boundary_levels(self) -> int:
        """Row tensors the boundary carries per image token (the embedding, each DeepStack level)."""
        return 1 + self.deepstack

    def seq_per_image(self, tokens_per_image: int | None = None) -> int:
        k = self.tokens_per_image if tokens_per_image is None else tokens_per_image
        return k * self.merge + self.cls_tokens

    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn
        # q, k, v, out (with biases); fc1, fc2 or gate, up, down (with biases); two norms
        mlp = 3 * h * f + 2 * f + h if self.gated_mlp else 2 * h * f + f + h
        return 4 * h * h + 4 * h + mlp + (2 if self.rms_norms else 4) * h + self.layer_extra

    def projector_params(self) -> int:
        biases = 0 if self.kind in ("gemma3", "gemma4") else sum(o for _, o in self.projector)
        return (1 + self.deepstack) * (sum(i * o for i, o in self.projector) + biases) + self.projector_norm

    def params(self) -> int:
        """Parameters the forward touches (the tower's unused tail is excluded, as the engine does)."""
        return self.embed_params + self.layers_backward * self.layer_params() + self.projector_params()

    def attention_spans(self, seq: int) -> tuple[tuple[int, int], ...]:
        """(layers, tower tokens one attention call spans) for an image of `seq` tower tokens."""
        if not self.window or self.window >= seq:
            return ((self.layers_forward, seq),)
        return ((self.full_layers, seq), (self.layers_forward - self.full_layers, self.window))

    def untrained_params(self) -> int:
        """Parameters the tower holds that no gradient reaches (layers after LLaVA's feature layer,
        the post-layernorm); held in memory, not in the optimizer. (SigLIP's pooling head, when the
        config has one, is not counted.)"""
        if self.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "gemma4", "gemma4_audio", "internvl"):
            return 0
        if self.held:
            return self.held
        return (self.layers_forward - self.layers_backward) * self.layer_params() + 2 * self.hidden

    def projector_replicated_params(self) -> int:
        """The projector's part of `replicated_params` (its row-parallel biases, the Qwen / InternVL
        norms before it; all of it when the projector is not split)."""
        if self.kind in ("gemma3", "gemma4") or self.replicated_projector:
            return self.projector_params()
        extra = self.projector_norm if self.kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl") else 0
        return (1 + self.deepstack) * self.projector[-1][1] + extra

    def projector_params_per_rank(self, tp: int) -> float:
        """The projector's parameters on one tp rank (the rest of `ModelSpec.params_per_rank("vision", tp)`
        is the tower's: a frozen tower's share, planner/frozen.py)."""
        if tp == 1:
            return self.projector_params()
        whole = self.projector_replicated_params()
        return (self.projector_params() - whole) / tp + whole

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: embeddings, norms, the biases of row-parallel linears
        (added after the reduction); everything else is split over tp."""
        h = self.hidden
        per_layer = (2 if self.rms_norms else 4) * h + 2 * h  # two norms; out and fc2 / down biases
        return self.embed_params + self.layers_backward * per_layer + self.projector_replicated_params()


@dataclass(frozen=True)
class LanguageSpec:
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    tied: bool
    qkv_bias: bool  # Qwen2 has q/k/v biases, Llama not
    extra_layer_norms: int = 0  # Gemma 3: pre/post-feedforward norms (2 h) and q/k norms (2 head_dim)
    # a mixture of experts in every decoder layer (Qwen3-VL-MoE); 0 experts: a dense SwiGLU of width ffn
    experts: int = 0  # routed experts per layer
    top_k: int = 0  # experts each token is sent to
    moe_ffn: int = 0  # one expert's SwiGLU width
    shared_ffn: int = 0  # a shared expert every token passes through (Qwen3.5-MoE), split over tp like a dense MLP

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def expert_layer_params(self) -> int:
        """One layer's experts: E gated MLPs (gate_up [E, 2f, h], down [E, h, f], no biases)."""
        return self.experts * 3 * self.hidden * self.moe_ffn

    def router_params(self) -> int:
        """One layer's router (`gate`, [E, h]): replicated over tp, trained with the dense weights."""
        return self.experts * self.hidden

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        if self.moe:
            return attn + self.router_params() + self.expert_layer_params() + 2 * h + self.extra_layer_norms
        return attn + 3 * h * self.ffn + 2 * h + self.extra_layer_norms  # gate, up, down; two RMSNorms

    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def vocab_params(self, tp: int = 1) -> int:
        """The input embedding and the head (one matrix when tied) on one tp rank: both are split on the
        vocabulary, ceil(vocab / tp) rows each (the last shard padded with zero rows)."""
        rows = -(-self.vocab // tp)
        return rows * self.hidden * (1 if self.tied else 2)

    def replicated_params(self) -> int:
        """Parameters every tp rank holds whole: the norms (a Qwen3 / Gemma 3 layer's q and k norms too),
        a MoE layer's router (its experts are not split over tp either: `expert_params`)."""
        return (2 * self.layers + 1) * self.hidden + self.layers * (self.extra_layer_norms + self.router_params())

    def expert_params(self, ep: int = 1, layers: int | None = None) -> int:
        """The experts one rank holds: E / ep of each layer's (replicated over tp, sharded over ep)."""
        return (self.layers if layers is None else layers) * self.expert_layer_params() // ep

    def params_per_rank(self, tp: int, ep: int = 1) -> int:
        """One tp rank's parameters: the layers' split weights / tp, the vocabulary shards, the norms,
        the router, and E / ep of the experts."""
        if not self.moe:
            if tp == 1:
                return self.params()
            split = self.params() - self.vocab_params() - self.replicated_params()
            return split // tp + self.vocab_params(tp) + self.replicated_params()
        split = self.params() - self.vocab_params() - self.replicated_params() - self.expert_params()
        return split // tp + self.vocab_params(tp) + self.replicated_params() + self.expert_params(ep)


@dataclass(frozen=True)
class ModelSpec:
    """A model's encoders, in the adapter's stage order, and its language model. A model with one
    encoder is the case of several with one; `view(name)` is one encoder and the language as the
    cost model prices them (flops.py, collectives.py, activations.py and memory.py read `vision`,
    the view's only encoder, without knowing its modality)."""

    family: str  # the HF model_type of the family: "llava", "qwen2_vl", ..., "qwen2_5_omni"
    encoders: tuple[tuple[str, EncoderSpec], ...]
    language: LanguageSpec

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.encoders)

    def encoder(self, name: str) -> EncoderSpec:
        return dict(self.encoders)[name]

    @property
    def vision(self) -> EncoderSpec:
        """The only encoder of a one-encoder model (or of a `view`)."""
        if len(self.encoders) != 1:
            raise ValueError(f"{self.family} has encoders {', '.join(self.names)}: take one with view(name)")
        return self.encoders[0][1]

    def view(self, name: str) -> "ModelSpec":
        """This encoder and the language model, as the cost model prices them."""
        return ModelSpec(self.family, ((name, self.encoder(name)),), self.language)

    def params(self) -> int:
        return sum(e.params() for _, e in self.encoders) + self.language.params()

    def stage_params(self, stage: str) -> int:
        return self.vision.params() if stage == "vision" else self.language.params()

    def params_per_rank(self, stage: str, tp: int, ep: int = 1) -> float:
        """Parameters one tp rank of the stage holds: the split ones / tp plus the replicated ones
        (a MoE language stage: E / ep of the experts)."""
        if stage == "language":
            return self.language.params_per_rank(tp, ep)
        s = self.vision
        whole = s.replicated_params() if tp > 1 else 0
        return (s.params() - whole) / tp + whole


def chunk_params_per_rank(spec: ModelSpec, tp: int, layers: int, first: bool, last: bool, ep: int = 1) -> float:
    """Parameters one tp rank of a language pipeline stage holds: its decoder layers, the input
    embedding (first stage) and the final norm and head (last stage), embedding and head split on
    the vocabulary (a tied matrix counted once when one stage holds both); a MoE layer's router
    whole and E / ep of its experts.
    With every layer, first and last it equals params_per_rank("language", tp, ep)."""
    lm = spec.language
    h = lm.hidden
    norms = 2 * h if tp > 1 else 0
    if lm.moe:
        whole = lm.router_params() + (lm.extra_layer_norms + 2 * h if tp > 1 else 0)
        layer = (lm.layer_params() - lm.expert_layer_params() - whole) / tp + whole + lm.expert_layer_params() / ep
    else:
        layer = (lm.layer_params() - norms) / tp + norms
    rows = -(-lm.vocab // tp)  # ceil(vocab / tp): the vocabulary shard of the embedding and of the head
    head = (0 if lm.tied and first else rows * h) + h
    return layers * layer + (rows * h if first else 0) + (head if last else 0)


def language_shapes(text: Any, cfg: Any) -> LanguageSpec:
    """A decoder's shapes from its text config; shared by the families' readers.

    `cfg`: the whole model's config; transformers 5 keeps `tie_word_embeddings` there (older
    checkpoints in the text config)."""
    hidden = get(text, "hidden_size")
    heads = get(text, "num_attention_heads")
    model_type = get(text, "model_type", "")
    return LanguageSpec(
        hidden=hidden, ffn=get(text, "intermediate_size"), heads=heads,
        kv_heads=get(text, "num_key_value_heads") or heads,
        head_dim=get(text, "head_dim") or hidden // heads, layers=get(text, "num_hidden_layers"),
        vocab=get(text, "vocab_size"),
        tied=bool(get(cfg, "tie_word_embeddings", False) or get(text, "tie_word_embeddings", False)),
        qkv_bias=str(model_type).startswith("qwen2"),
    )


def one_encoder(family: str, encoder: EncoderSpec, language: LanguageSpec) -> ModelSpec:
    """A model whose one encoder is the stage "vision"."""
    return ModelSpec(family, (("vision", encoder),), language)
