"""Entry points: shard one stage's Hugging Face modules over that stage's tp group.

    stage      call                                               families
    vision     shard_vision_tower(tower, group)                   CLIP, SigLIP, Qwen2-VL (incl. its merger)
               shard_projector(projector, group)                  LLaVA multi-modal projector
    language   shard_language_model(model, group, sequence_parallel=False, pad_vocab=False)
                                                                  Llama, Qwen2, Qwen2-VL text (the decoder from
                                                                  model.get_decoder(), a vocab-parallel input
                                                                  embedding and lm_head, tied or not)

Each call checks everything first (HeteroConfigError naming the module and the numbers, the
same on every rank, before any collective), then shards in place without communicating: every
rank must hold the same full weights (same seed or same checkpoint) and keeps its slice.
A group of one rank leaves the modules untouched.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..errors import HeteroConfigError
from .shard_plans import PlanTable, apply_plans, validate_tensor_parallel
from .embedding import VocabParallelEmbedding, check_plain_embedding, padded_vocab
from .sequence_parallel import apply_sequence_parallel
from .vocab import VocabParallelCausalLMLoss, VocabParallelLMHead


def _tp(group) -> int:
    if group is None:
        raise TypeError("pass the stage's tp process group explicitly")
    return dist.get_world_size(group)


def shard_vision_tower(tower: nn.Module, group, stage: str = "vision", *, plans: PlanTable) -> nn.Module:
    """Shard a vision tower's attention and MLP blocks (and Qwen2-VL's patch merger) over `group`
    by the plans of its module classes (`plans`: the family registry's `tp_plans()`)."""
    found = validate_tensor_parallel(tower, _tp(group), stage, plans=plans)
    if _tp(group) > 1:
        apply_plans(found, group)
    return tower


def shard_projector(projector: nn.Module, group, stage: str = "vision", *, plans: PlanTable) -> nn.Module:
    """Shard the LLaVA projector (linear_1 column, linear_2 row); its output is replicated."""
    return shard_vision_tower(projector, group, stage, plans=plans)


PAD_WITH_ARGUMENT = "pass pad_vocab=True to pad it to {padded}"
# HeteroEngine has no padding knob: say what a user of initialize can do.
PAD_YOURSELF = ("use a language tp that divides it, or pad the model's vocabulary before initialize, e.g. "
                "model.resize_token_embeddings({vocab}, pad_to_multiple_of={tp}) to {padded} (the new tokens "
                "then take part in the softmax)")


def check_head(model: nn.Module, tp: int, pad_vocab: bool, stage: str, advice: str = PAD_WITH_ARGUMENT) -> None:
    """The output head and the input embedding can be split on the vocabulary over `tp` ranks.

    Tied embeddings are fine: the head and the embedding then share the one sharded parameter.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise HeteroConfigError(f"hetero_parallel.stages.{stage}", f"{type(model).__name__} has no output head to shard")
    check_plain_embedding(model.get_input_embeddings(), stage)
    for what, vocab in (("output head", head.out_features),
                        ("input embedding", model.get_input_embeddings().num_embeddings)):
        if vocab % tp and not pad_vocab:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{stage}.tp",
                f"tp={tp} does not divide the vocabulary ({vocab}) of the {what}; " + advice.format(vocab=vocab, tp=tp, padded=padded_vocab(vocab, tp)))


def is_tied(model: nn.Module) -> bool:
    """Whether the model's output head and input embedding are one parameter (tie_word_embeddings)."""
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


def shard_embeddings(model: nn.Module, group, sequence_parallel: bool = False, pad_vocab: bool = False,
                     stage: str = "language", split_input: bool = True
                     ) -> tuple[VocabParallelLMHead, VocabParallelEmbedding]:
    """Replace the head and the input embedding by their vocabulary shards; a tie stays a tie.

    With sequence parallelism the head gathers the decoder's sequence chunks (all-gather). The
    embedding's output is replicated (all-reduce) when the decoder splits its input itself
    (`split_input`), else this rank's sequence chunk (reduce-scatter: Megatron's embedding).
    """
    tied = is_tied(model)
    embedding_sp = sequence_parallel and not split_input
    decoder = model.get_decoder()
    embedding = decoder.get_input_embeddings()
    head = VocabParallelLMHead.from_linear(model.get_output_embeddings(), group, pad_vocab=pad_vocab,
                                           sequence_parallel=sequence_parallel, seq_dim=1, stage=stage)
    # Tied: one parameter, two uses, so autograd sums both gradients into it. (With the embedding
    # and the head on different pipeline chunks this would become two equal copies whose gradients
    # are summed over an embedding group: docs/embeddings.md; no pipelined language stage yet.)
    if tied:
        new_embedding = VocabParallelEmbedding.tie_to_head(embedding, head, embedding_sp, 1, stage)
    else:
        new_embedding = VocabParallelEmbedding.from_embedding(embedding, group, pad_vocab, embedding_sp, 1, stage)
    model.set_output_embeddings(head)
    decoder.set_input_embeddings(new_embedding)
    model.loss_function = VocabParallelCausalLMLoss(head)
    return head, new_embedding


def shard_language_model(model: nn.Module, group, sequence_parallel: bool = False, pad_vocab: bool = False,
                         stage: str = "language", split_input: bool = True, *, plans: PlanTable) -> nn.Module:
    """Shard a causal LM's decoder, input embedding and output head (both on the vocabulary, tied or
    not); `model(..., labels=...)` then gives the exact loss.

    After this, `model(...).logits` are this rank's vocabulary slice [.., V/tp] (see
    VocabParallelLMHead.vocab_start); with sequence_parallel the decoder's hidden states
    between blocks (and its final output) are sharded on the sequence dim. `split_input=False`:
    the caller embeds the ids of the whole sequence itself and feeds the decoder the embedding's
    output, which under sequence parallelism is already this rank's chunk (`local_ids` names its
    ids); see apply_sequence_parallel.
    """
    tp = _tp(group)
    decoder = model.get_decoder()
    found = validate_tensor_parallel(decoder, tp, stage, plans=plans)
    if tp == 1:  # nothing to shard
        return model
    check_head(model, tp, pad_vocab, stage)
    apply_plans(found, group, sequence_parallel=sequence_parallel, seq_dim=1)
    shard_embeddings(model, group, sequence_parallel, pad_vocab, stage, split_input)
    if sequence_parallel:
        apply_sequence_parallel(decoder, group, seq_dim=1, split_input=split_input)
    return model
