"""The vocabulary-parallel input embedding and tied embeddings at tp 2, against torch / Hugging Face.

One 2-rank launch:
- `VocabParallelEmbedding` against `nn.Embedding` (ids from every shard, a padding_idx, a
  vocabulary tp does not divide): output replicated (all-reduce) and on sequence chunks
  (reduce-scatter), the gathered weight gradient, and (without padding_idx) the adjoint identity
  sum_ranks <A w, y> = sum_ranks <w, A^T y> of the lookup as a linear map of the weight;
- a tied Llama LM sharded by `shard_language_model` (with and without sequence parallelism)
  against the unsharded tied model: loss, logits, the one tied parameter and its gradient (the
  sum of the head's and the embedding's); negative control: the same model with the tie cut
  after sharding (the head's gradient not added to the embedding's) misses the reference;
- embedding bytes per rank: half the replicated figure plus the padding rows, measured;
- a tied LLaVA checkpoint read per tp shard (meta model + weights) equals the built model
  sharded, reads the tied tensor once (its shard) and stays tied.
"""

import pytest

from ds_hetero.testing.launch import run_distributed

pytestmark = pytest.mark.distributed

RTOL = 1e-5
HIDDEN = 16


def _embedding_case(group, vocab, padding_idx, sequence_parallel):
    import torch
    import torch.distributed as dist
    from torch import nn

    from ds_hetero.tensor_parallel import gather_full
    from ds_hetero.tensor_parallel.embedding import VocabParallelEmbedding

    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    gen = torch.Generator().manual_seed(5)
    ref = nn.Embedding(vocab, HIDDEN, padding_idx=padding_idx)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(vocab, HIDDEN, generator=gen))
    ids = torch.randint(0, vocab, (3, 8), generator=gen)
    ids[0, :4] = torch.tensor([0, vocab - 1, padding_idx or 0, vocab // 2])  # both ends, the pad, the border
    y = torch.randn(3, 8, HIDDEN, generator=gen)  # the incoming gradient, the same on every rank

    emb = VocabParallelEmbedding.from_embedding(ref, group, pad_vocab=True, sequence_parallel=sequence_parallel)
    out = emb(ids)
    want = ref(ids)
    chunk = 8 // tp
    mine = emb.local_ids(ids)
    y_mine = y[:, rank * chunk:(rank + 1) * chunk] if sequence_parallel else y
    want_mine = want[:, rank * chunk:(rank + 1) * chunk] if sequence_parallel else want
    (out * y_mine).sum().backward()
    (want * y).sum().backward()
    grad = gather_full(emb.weight.grad, emb.weight, group)
    # adjoint: <A w, y> over the output's placement equals <w, A^T y> summed over the shards
    lhs = torch.tensor([(out.detach().double() * y_mine.double()).sum().item()])
    rhs = torch.tensor([(emb.weight.detach().double() * emb.weight.grad.double()).sum().item()])
    dist.all_reduce(rhs, group=group)
    if sequence_parallel:
        dist.all_reduce(lhs, group=group)
    return dict(
        value=(out - want_mine).abs().max().item(),
        ids=torch.equal(mine, ids[:, rank * chunk:(rank + 1) * chunk] if sequence_parallel else ids),
        grad=(grad - ref.weight.grad).abs().max().item() / ref.weight.grad.abs().max().item(),
        pad_row_grad=0.0 if padding_idx is None else grad[padding_idx].abs().max().item(),
        # (a padding_idx row gets no gradient by design, so the lookup's backward is its adjoint
        # only without one)
        adjoint=abs(lhs.item() - rhs.item()) / abs(rhs.item()) if padding_idx is None else None,
        rows=emb.weight.shape[0], bytes=emb.weight.numel() * emb.weight.element_size(),
        full_bytes=ref.weight.numel() * ref.weight.element_size(),
    )


def _untie(model):
    """Negative control: the head gets its own copy of the tied shard (equal values, separate gradient)."""
    import torch

    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    for key in ("tensor_model_parallel", "partition_dim", "partition_stride", "partition_full_size"):
        setattr(head.weight, key, getattr(model.get_input_embeddings().weight, key))


def _tied_lm_case(group, sequence_parallel, untie=False):
    import torch

    from ds_hetero.tensor_parallel import shard_language_model

    from ds_hetero.families import tp_plans
    from tests.helpers.tp_checks import gather_vocab, llama_lm, param_errors, rel_err, twin

    ref, model = twin(lambda: llama_lm(tie_word_embeddings=True))
    assert ref.lm_head.weight is ref.model.embed_tokens.weight
    shard_language_model(model, group, sequence_parallel=sequence_parallel, plans=tp_plans())
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if untie:
        _untie(model)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (2, 16), generator=gen)
    out_ref, out = ref(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
    out_ref.loss.backward()
    out.loss.backward()
    logits = gather_vocab(out.logits, model.lm_head, group)
    if untie:  # the embedding's own gradient against the reference's tied one
        errs = param_errors(ref.model.embed_tokens, model.model.embed_tokens, group)
    else:
        errs = param_errors(ref, model, group)
    emb = model.model.embed_tokens
    return dict(tied=tied, loss=rel_err(out.loss.detach(), out_ref.loss.detach()),
                logits=rel_err(logits, out_ref.logits.detach()), n_params=len(list(model.parameters())),
                n_ref_params=len(list(ref.parameters())), embedding_bytes=emb.weight.numel() * emb.weight.element_size(),
                **errs)


def _tied_loading_case(group, tmp):
    """A tied LLaVA read per tp shard from a safetensors checkpoint equals the built model sharded."""
    import copy

    import torch
    import torch.distributed as dist

    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava
    from ds_hetero.tensor_parallel import shard_language_model
    from ds_hetero.families import tp_plans
    from ds_hetero.weights import load_stages, meta_model, open_weights

    built = tiny_llava("clip", seed=4, tie_word_embeddings=True)
    if dist.get_rank() == 0:
        built.save_pretrained(tmp)  # one tensor for the tie, as transformers writes it
    dist.barrier()
    meta = meta_model(tmp)
    checkpoint = open_weights(meta, tmp)  # full shapes checked before sharding, as initialize does
    shard_language_model(meta, group, split_input=False, plans=tp_plans())
    language = adapter_for(meta).split()["language"]
    report = load_stages(meta, {"language": language}, {"language": (dist.get_rank(group), 2)}, checkpoint,
                         torch.device("cpu"))["language"]
    want = shard_language_model(copy.deepcopy(built), group, split_input=False, plans=tp_plans())
    got_params, want_params = dict(meta.named_parameters()), dict(want.named_parameters())
    lm = [n for n in want_params if "vision" not in n and "projector" not in n]
    emb = meta.get_input_embeddings().weight
    return dict(tied=meta.lm_head.weight is emb, names=sorted(set(lm) ^ {n for n in got_params if n in lm}),
                equal=all(torch.equal(got_params[n], want_params[n]) for n in lm), compared=len(lm),
                embedding_read=[n for n in report.tensors if "embed_tokens" in n or "lm_head" in n],
                sharded_read=(report.sharded_bytes_read, report.sharded_bytes_full))


def _suite(rank, world_size, tmp):
    import torch.distributed as dist

    from ds_hetero.topology.groups import build_groups
    from ds_hetero.layout import StageLayout

    group = build_groups({"language": StageLayout("language", 2, 1, 1, (0, 1))}, rank)["language"].tp
    out = {}
    for vocab, pad, sp in ((64, None, False), (64, None, True), (251, 7, False), (251, 250, True)):
        out[f"embedding V{vocab} pad{pad} sp{sp}"] = _embedding_case(group, vocab, pad, sp)
    for sp in (False, True):
        out[f"tied llama sp{sp}"] = _tied_lm_case(group, sp)
    out["control: tie cut"] = _tied_lm_case(group, False, untie=True)
    out["tied loading"] = _tied_loading_case(group, tmp)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_suite, world_size=2, timeout=300, tmp=str(tmp_path_factory.mktemp("tied")))


def test_vocab_parallel_embedding_equals_the_full_lookup(results):
    for rank, res in enumerate(results):
        cases = [k for k in res if k.startswith("embedding")]
        assert len(cases) == 4 and sum(res[c]["adjoint"] is not None for c in cases) == 2
        for case in cases:
            r = res[case]
            assert r["value"] == 0.0 and r["ids"], (rank, case, r)  # one non-zero term per row: exact
            assert r["grad"] <= RTOL and (r["adjoint"] is None or r["adjoint"] <= 1e-12), (rank, case, r)
            assert r["pad_row_grad"] == 0.0, (rank, case, r)  # padding_idx keeps nn.Embedding's rule


def test_embedding_bytes_per_rank_are_half_plus_padding(results):
    for res in results:
        even, odd = res["embedding V64 padNone spFalse"], res["embedding V251 pad7 spFalse"]
        assert even["bytes"] * 2 == even["full_bytes"], even
        row = HIDDEN * 4
        assert odd["rows"] == 126 and odd["bytes"] == odd["full_bytes"] / 2 + row / 2, odd  # 251 -> 252 rows / 2


@pytest.mark.parametrize("sp", [False, True])
def test_tied_language_model_matches_the_unsharded_tied_model(results, sp):
    for rank, res in enumerate(results):
        r = res[f"tied llama sp{sp}"]
        assert r["tied"] and r["n_params"] == r["n_ref_params"], r  # one parameter, listed once
        assert max(r["loss"], r["logits"], r["value"], r["grad"]) <= RTOL, (rank, r)
        assert r["n_sharded"] > 0


def test_control_cutting_the_tie_misses_the_reference(results):
    for r in results:
        c = r["control: tie cut"]
        assert c["loss"] <= RTOL and c["value"] <= RTOL, c  # same forward...
        assert c["grad"] > 1e-2, c  # ...but the embedding's gradient lacks the head's part


def test_tied_checkpoint_loads_per_shard_and_stays_tied(results):
    for r in results:
        t = r["tied loading"]
        assert t["tied"] and t["equal"] and t["compared"] > 0 and not t["names"], t
        assert len(t["embedding_read"]) == 1, t  # the tied tensor is read once, its shard only
        read, full = t["sharded_read"]
        assert 2 * read == full > 0, t
