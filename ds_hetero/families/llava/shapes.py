"""The planner's shapes of LLaVA (CLIP or SigLIP tower, two-linear projector), read from its Hugging Face config.

`SHAPES` maps each HF `model_type` this family reads to its reader (the registry, families/__init__.py,
hands them to the planner: planner/model_spec.py); the records are models/shapes.py's.
"""

from __future__ import annotations

from typing import Any

from ...models.shapes import EncoderSpec, ModelSpec, get, language_shapes, one_encoder


def shapes(cfg: Any) -> ModelSpec:
    v, text = get(cfg, "vision_config"), get(cfg, "text_config")
    kind = str(get(v, "model_type", "clip_vision_model"))
    kind = "siglip" if kind.startswith("siglip") else "clip"
    layers = get(v, "num_hidden_layers")
    feature = get(cfg, "vision_feature_layer", -2)
    wanted = [feature] if isinstance(feature, int) else list(feature)
    deepest = max(k if k >= 0 else layers + 1 + k for k in wanted)  # hidden_states[k]: after k layers
    grid = (get(v, "image_size") // get(v, "patch_size")) ** 2
    has_cls = kind == "clip"
    keeps_cls = has_cls and get(cfg, "vision_feature_select_strategy", "default") == "full"
    vh, th = get(v, "hidden_size"), get(text, "hidden_size")
    return one_encoder("llava", EncoderSpec(
        kind=kind, hidden=vh, ffn=get(v, "intermediate_size"), heads=get(v, "num_attention_heads"),
        layers_forward=layers, layers_backward=deepest,
        patch_in=get(v, "num_channels", 3) * get(v, "patch_size") ** 2,
        tokens_per_image=grid + int(keeps_cls), merge=1, cls_tokens=int(has_cls and not keeps_cls),
        projector=((vh * len(wanted), th), (th, th)),
        # CLIP: conv without bias, CLS, grid + 1 positions, pre-layernorm; SigLIP: conv with bias, grid positions
        embed_params=(get(v, "num_channels", 3) * get(v, "patch_size") ** 2 * vh
                      + ((vh + (grid + 1) * vh + 2 * vh) if has_cls else (vh + grid * vh))),
    ), language_shapes(text, cfg))


SHAPES = {"llava": shapes}
