"""What one optimizer step processes: the global batch, its sequence length and image tokens (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from .model_spec import ModelSpec


@dataclass(frozen=True)
class Workload:
    """seq_len     language tokens per sample, image placeholders included
    image_tokens   image tokens per sample (LLaVA: a multiple of its tokens per image; Qwen2-VL:
                   one image of that many tokens, spatial_merge^2 patches each)
    global_batch   samples per optimizer step
    dtype_bytes    bytes of a parameter, a gradient and an activation (2 for bf16, 4 for fp32)
    zero           ZeRO stage of every stage engine
    """

    seq_len: int
    image_tokens: int
    global_batch: int
    dtype_bytes: int = 2
    zero: int = 1

    def images_per_sample(self, spec: ModelSpec) -> int:
        if spec.vision.tokens_per_image == 0:  # dynamic resolution: one image of image_tokens tokens
            return 1 if self.image_tokens else 0
        return self.image_tokens // spec.vision.tokens_per_image

    def tokens_per_image(self, spec: ModelSpec) -> int:
        return spec.vision.tokens_per_image or self.image_tokens

    def check(self, spec: ModelSpec) -> None:
        if self.image_tokens > self.seq_len:
            raise ValueError(f"--image-tokens {self.image_tokens} exceeds --seq-len {self.seq_len}")
        t = spec.vision.tokens_per_image
        if t and self.image_tokens % t:
            raise ValueError(f"--image-tokens {self.image_tokens} is not a multiple of this model's {t} tokens per "
                             f"image; use a multiple of {t}")
