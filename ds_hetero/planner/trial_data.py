"""Samples shaped like the planned workload, for measured trials (pure torch, seeded, no downloads).

Every sample has `seq_len` tokens: [bos] + one image's placeholders (+ Qwen2-VL's vision start
and end) + random caption words + [eos], in the formats the adapters read (toy/shapes.py).
LLaVA: one image at the tower's size (its tokens are fixed by the model, so `image_tokens` must
be a multiple of them: each further image would need multi-image samples, which the trial
data does not make; the first image's count is used). Qwen2-VL: one image of `image_tokens`
tokens, a strip of patch x merge pixels high.
"""

from __future__ import annotations

import torch

from ..families.llava.sample_format import LlavaFormat
from ..families.qwen2_vl.sample_format import Qwen2VLFormat
from ..toy.shapes import Vocabulary


def _llava(cfg, seq_len: int, n: int, gen: torch.Generator) -> list[dict]:
    v = cfg.vision_config
    keeps_cls = v.model_type.startswith("clip") and cfg.vision_feature_select_strategy == "full"
    tokens = (v.image_size // v.patch_size) ** 2 + int(keeps_cls)
    vocab = Vocabulary(cfg.text_config.vocab_size, cfg.image_token_id)
    fmt = LlavaFormat(tokens, v.image_size)
    words = seq_len - 2 - tokens
    if words < 1:
        raise ValueError(f"--seq-len {seq_len} leaves no caption after this model's {tokens} image tokens")
    out = []
    for _ in range(n):
        caption = torch.randint(vocab.first_word_id, vocab.first_word_id + len(vocab.words), (words,), generator=gen)
        image = torch.rand(3, v.image_size, v.image_size, generator=gen)
        out.append(fmt.sample(vocab, caption.tolist(), image))
    return out


def _qwen2_vl(cfg, seq_len: int, image_tokens: int, n: int, gen: torch.Generator) -> list[dict]:
    v = cfg.vision_config
    vocab = Vocabulary(cfg.text_config.vocab_size, cfg.image_token_id,
                       reserved_ids=(cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id))
    fmt = Qwen2VLFormat(v.patch_size, v.spatial_merge_size, v.temporal_patch_size, cfg.vision_start_token_id,
                        cfg.vision_end_token_id)
    side = v.patch_size * v.spatial_merge_size
    hw = (side, side * image_tokens)  # merge x (merge * image_tokens) patches: image_tokens tokens
    words = seq_len - 4 - image_tokens
    if words < 1:
        raise ValueError(f"--seq-len {seq_len} leaves no caption after {image_tokens} image tokens")
    out = []
    for _ in range(n):
        caption = torch.randint(vocab.first_word_id, vocab.first_word_id + len(vocab.words), (words,), generator=gen)
        out.append(fmt.sample(vocab, caption.tolist(), torch.rand(3, *hw, generator=gen)))
    return out


def workload_samples(model_config, seq_len: int, image_tokens: int, n: int, seed: int = 0) -> list[dict]:
    """`n` samples of `seq_len` tokens with one image each, identical on every rank for one seed."""
    gen = torch.Generator().manual_seed(seed)
    kind = model_config.model_type
    if kind == "llava":
        return _llava(model_config, seq_len, n, gen)
    if kind == "qwen2_vl":
        return _qwen2_vl(model_config, seq_len, image_tokens, n, gen)
    raise ValueError(f"trials know llava and qwen2_vl models, got {kind!r}")
