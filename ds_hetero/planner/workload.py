"""What one optimizer step processes: the global batch, its sequence length and image tokens (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .frozen import Freeze
from ..models.shapes import ModelSpec

# how `plan --attention` prices packed rows: as the model's kernel runs them, as a varlen kernel
# (flash-attention, or sdpa / eager called per sample: each sample's own scores), or as a dense one
# (sdpa, eager under packed_attention "row_mask": each row scored whole)
ATTENTION_KERNELS = ("model", "varlen", "dense")


@dataclass(frozen=True)
class Workload:
    """seq_len     language tokens per sample, image placeholders included
    image_tokens   image tokens per sample the language model receives (LLaVA: a multiple of its
                   tokens per image; Qwen2-VL: one image of that many tokens, spatial_merge^2
                   patches each, so the encoder sees merge x as many: `encoder_tokens`)
    global_batch   samples per optimizer step
    dtype_bytes    bytes of a parameter, a gradient and an activation (2 for bf16, 4 for fp32)
    zero           ZeRO stage of every stage engine
    freeze         what of each stage trains (the base config's `freeze`, frozen.py)
    rows           (encoder, boundary rows per sample) of a model with several encoders, whose
                   image_tokens is then their sum; () for one encoder (its rows: image_tokens)
    lengths        language tokens of each sample of the batch, in batch order (a length mix); ()
                   for every sample `seq_len` tokens. The language stage is then priced as the
                   runtime cuts these samples (language_mix.py); the encoders keep image_tokens
    batching       the base config's `language_batching` ("samples" or "packed") and
    budget         its `max_tokens_per_micro_batch`: how the runtime cuts the length mix
    dense          whether the language's attention scores a packed row whole (`packed_attention`
                   "row_mask": the adapter's `dense_rows`): packed rows are then the runtime's dense rows
                   (step/rows.py), each priced padded and whole
    torch_adam     the optimizer is torch's Adam / AdamW (`"torch_adam": true`), whose step allocates
                   temporaries the size of the master partition (memory.py `optimizer_transient`)
    memo           language_mix.py's rows of the mix per layout (not part of the workload's identity)
    """

    seq_len: int
    image_tokens: int
    global_batch: int
    dtype_bytes: int = 2
    zero: int = 1
    freeze: Freeze = Freeze()
    rows: tuple[tuple[str, int], ...] = ()
    lengths: tuple[int, ...] = ()
    batching: str = "samples"
    budget: int | None = None
    dense: bool = False
    torch_adam: bool = False
    # the language's rows per (dp, micro-batches, shards) of the length mix, filled by language_mix.py
    # (the search asks for each layout many times); one plan's, shared by its replace()d copies
    memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def real_tokens(self) -> int:
        """Language tokens of the step's samples (no padding): what tokens/s counts."""
        return sum(self.lengths[:self.global_batch]) if self.lengths else self.global_batch * self.seq_len

    def of(self, encoder: str) -> Workload:
        """The workload as the cost model prices one encoder (with the language): that encoder's rows
        as its image tokens, its freeze as the view's encoder's (the stage "vision" of `ModelSpec.view`)."""
        if not self.rows:
            return self
        return replace(self, image_tokens=dict(self.rows)[encoder], rows=(), freeze=self.freeze.view(encoder))

    def images_per_sample(self, spec: ModelSpec) -> int:
        if spec.vision.tokens_per_image == 0:  # dynamic resolution: one image of image_tokens tokens
            return 1 if self.image_tokens else 0
        return self.image_tokens // spec.vision.tokens_per_image

    def tokens_per_image(self, spec: ModelSpec) -> int:
        return spec.vision.tokens_per_image or self.image_tokens

    def encoder_tokens(self, spec: ModelSpec) -> int:
        """Tokens the encoder's tower sees per sample: the language's image tokens times the spatial
        merge (Qwen2-VL: 2x2 patches per image token), plus CLIP's CLS per image."""
        return self.images_per_sample(spec) * spec.vision.seq_per_image(self.tokens_per_image(spec))

    def check_lengths(self) -> None:
        if self.lengths and (len(self.lengths) < self.global_batch or min(self.lengths) < 1):
            raise ValueError(f"--lengths: {len(self.lengths)} sample lengths for a global batch of "
                             f"{self.global_batch}; give at least one positive length per sample")

    def check(self, spec: ModelSpec) -> None:
        if self.image_tokens > self.seq_len:
            hint = (f" (the encoder may see more: --encoder-tokens {self.image_tokens * spec.vision.merge} gives the "
                    f"language {self.image_tokens} after this model's {spec.vision.merge}-patch merge)"
                    if spec.vision.merge > 1 else "")
            raise ValueError(f"--image-tokens {self.image_tokens} (image tokens the language model receives) exceeds "
                             f"--seq-len {self.seq_len}{hint}")
        self.check_lengths()
        t = spec.vision.tokens_per_image
        if t and self.image_tokens % t:
            raise ValueError(f"--image-tokens {self.image_tokens} is not a multiple of this model's {t} tokens per "
                             f"image; use a multiple of {t}")


def image_tokens_of(spec: ModelSpec, image_tokens: int | None, encoder_tokens: int | None) -> int:
    """The language's image tokens per sample from either count (`--image-tokens` or `--encoder-tokens`)."""
    if (image_tokens is None) == (encoder_tokens is None):
        raise ValueError("give exactly one of --image-tokens (tokens the language model receives) and "
                         "--encoder-tokens (tokens the encoder sees, before its spatial merge)")
    if image_tokens is not None:
        return image_tokens
    v = spec.vision
    if v.tokens_per_image:  # fixed images (LLaVA): the tower sees seq_per_image tokens per image
        per = v.seq_per_image()
        if encoder_tokens % per:
            raise ValueError(f"--encoder-tokens {encoder_tokens} is not a multiple of this model's {per} tower tokens "
                             f"per image")
        return encoder_tokens // per * v.tokens_per_image
    if encoder_tokens % v.merge:
        raise ValueError(f"--encoder-tokens {encoder_tokens} is not a multiple of this model's spatial merge "
                         f"({v.merge} patches per image token)")
    return encoder_tokens // v.merge


def samples_per_rank(global_batch: int, dp: int, passes: int) -> int:
    """Samples the busiest dp rank of a stage takes per pass: ceil(batch / (dp x passes)). An encoder
    may have more dp ranks than a pass has samples (images are its unit, step/balance.py): the
    busiest rank still encodes a whole sample's images (the engine's nominal micro-batch size,
    `HeteroConfig.micro_batch_size`). The language's batch divides evenly (its checks)."""
    return -(-global_batch // (dp * passes))
