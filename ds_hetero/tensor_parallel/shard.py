"""Entry points: shard one stage's Hugging Face modules over that stage's tp group.

    stage      call                                               families
    vision     shard_vision_tower(tower, group)                   CLIP, SigLIP, Qwen2-VL (incl. its merger)
               shard_projector(projector, group)                  LLaVA multi-modal projector
    language   shard_language_model(model, group, sequence_parallel=False, pad_vocab=False)
                                                                  Llama, Qwen2, Qwen2-VL text (the decoder from
                                                                  model.get_decoder() plus a vocab-parallel lm_head)

Each call checks everything first (HeteroConfigError naming the module and the numbers, the
same on every rank, before any collective), then shards in place without communicating: every
rank must hold the same full weights (same seed or same checkpoint) and keeps its slice.
A group of one rank leaves the modules untouched.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..errors import HeteroConfigError
from .plans import apply_plans, validate_tensor_parallel
from .sequence_parallel import apply_sequence_parallel
from .vocab import VocabParallelCausalLMLoss, VocabParallelLMHead


def _tp(group) -> int:
    if group is None:
        raise TypeError("pass the stage's tp process group explicitly")
    return dist.get_world_size(group)


def shard_vision_tower(tower: nn.Module, group, stage: str = "vision") -> nn.Module:
    """Shard a vision tower's attention and MLP blocks (and Qwen2-VL's patch merger) over `group`."""
    found = validate_tensor_parallel(tower, _tp(group), stage)
    if _tp(group) > 1:
        apply_plans(found, group)
    return tower


def shard_projector(projector: nn.Module, group, stage: str = "vision") -> nn.Module:
    """Shard the LLaVA projector (linear_1 column, linear_2 row); its output is replicated."""
    return shard_vision_tower(projector, group, stage)


PAD_WITH_ARGUMENT = "pass pad_vocab=True to pad it to {padded}"
# HeteroEngine has no padding knob: say what a user of initialize can do.
PAD_YOURSELF = ("use a language tp that divides it, or pad the model's vocabulary before initialize, e.g. "
                "model.resize_token_embeddings({vocab}, pad_to_multiple_of={tp}) to {padded} (the new tokens "
                "then take part in the softmax)")


def _check_head(model: nn.Module, tp: int, pad_vocab: bool, stage: str, advice: str = PAD_WITH_ARGUMENT) -> None:
    head = model.get_output_embeddings()
    if head is None:
        raise HeteroConfigError(f"hetero_parallel.stages.{stage}", f"{type(model).__name__} has no output head to shard")
    if head.weight is model.get_input_embeddings().weight:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.tp", "tied input/output embeddings cannot take a vocabulary-parallel head "
            "(the embedding stays replicated); build the model with tie_word_embeddings=False")
    if head.out_features % tp and not pad_vocab:
        raise HeteroConfigError(
            f"hetero_parallel.stages.{stage}.tp", f"tp={tp} does not divide the vocabulary ({head.out_features}) of the output "
            "head; " + advice.format(vocab=head.out_features, tp=tp, padded=-(-head.out_features // tp) * tp))


def shard_language_model(model: nn.Module, group, sequence_parallel: bool = False, pad_vocab: bool = False,
                         stage: str = "language") -> nn.Module:
    """Shard a causal LM's decoder and output head; `model(..., labels=...)` then gives the exact loss.

    After this, `model(...).logits` are this rank's vocabulary slice [.., V/tp] (see
    VocabParallelLMHead.vocab_start); with sequence_parallel the decoder's hidden states
    between blocks (and its final output) are sharded on the sequence dim.
    """
    tp = _tp(group)
    decoder = model.get_decoder()
    found = validate_tensor_parallel(decoder, tp, stage)
    if tp == 1:  # nothing to shard; a tied head is fine here
        return model
    _check_head(model, tp, pad_vocab, stage)
    apply_plans(found, group, sequence_parallel=sequence_parallel, seq_dim=1)
    if sequence_parallel:
        apply_sequence_parallel(decoder, group, seq_dim=1)
    head = VocabParallelLMHead.from_linear(model.get_output_embeddings(), group, pad_vocab=pad_vocab,
                                           sequence_parallel=sequence_parallel, seq_dim=1, stage=stage)
    model.set_output_embeddings(head)
    model.loss_function = VocabParallelCausalLMLoss(head)
    return model
