"""Pure pieces of a pipelined stage's checkpoint (ds_hetero/checkpoint/layer_map.py, manifest.py):
the layer map check against the manifest's cut, chunk folders, and the layout comparison with pp."""

from ds_hetero.checkpoint.layer_map import check_layer_map, chunk_folder, part_dirs
from ds_hetero.checkpoint.manifest import describe_layout, same_layout

PREFIX = "model.language_model"


def _chunk(index, layers, embed=False, head=False):
    """params.json of a chunk holding global `layers` (as a PipelineChunk names them: locally)."""
    params = {}
    for local, layer in enumerate(layers):
        for leaf in ("self_attn.q_proj.weight", "mlp.up_proj.weight"):
            params[f"decoder.layers.{local}.{leaf}"] = {"hf_name": f"{PREFIX}.layers.{layer}.{leaf}", "shape": [4, 4]}
    if embed:
        params["decoder.embed_tokens.weight"] = {"hf_name": f"{PREFIX}.embed_tokens.weight", "shape": [8, 4]}
    if head:
        params["decoder.norm.weight"] = {"hf_name": f"{PREFIX}.norm.weight", "shape": [4]}
        params["lm_head.weight"] = {"hf_name": "lm_head.weight", "shape": [8, 4]}
    return {"params": params, "chunk": {"index": index, "layers": [layers[0], layers[-1] + 1]}}


def test_layer_map_matches_the_cut():
    metas = [_chunk(0, [0], embed=True), _chunk(1, [1, 2, 3], head=True)]
    assert check_layer_map(metas, [1, 3], "ckpt") is None
    assert check_layer_map([metas[0]], None, "ckpt") is None  # no pipeline: nothing to map


def test_a_wrong_layer_map_is_refused():
    metas = [_chunk(0, [0], embed=True), _chunk(1, [1, 2, 3], head=True)]
    # the manifest's cut disagrees with the chunks' recorded ranges
    assert "chunk 0 holds layers 0..0" in check_layer_map(metas, [2, 2], "ckpt")
    # a chunk's local index is off by one against its global name (recorded range stripped)
    shifted = _chunk(1, [1, 2, 3], head=True)
    shifted["chunk"] = None
    shifted["params"] = {k.replace("layers.0.", "layers.X.").replace("layers.1.", "layers.0.")
                         .replace("layers.X.", "layers.1."): v for k, v in shifted["params"].items()}
    assert "starts chunk 1 at layer 1" in check_layer_map([metas[0], shifted], [1, 3], "ckpt")
    # one parameter saved by two chunks
    twice = _chunk(1, [1, 2, 3], head=True)
    twice["params"]["decoder.embed_tokens.weight"] = {"hf_name": f"{PREFIX}.embed_tokens.weight", "shape": [8, 4]}
    assert "saved by chunks 0 and 1" in check_layer_map([metas[0], twice], [1, 3], "ckpt")
    # a chunk missing a layer of its range
    missing = _chunk(1, [1, 2, 3], head=True)
    missing["chunk"] = None
    missing["params"] = {k: v for k, v in missing["params"].items() if ".layers.2." not in k}
    assert "holds layers [1, 2]" in check_layer_map([metas[0], missing], [1, 3], "ckpt")


def test_tied_copy_is_saved_once():
    """Tied embeddings with pp > 1: the last chunk's head is a copy of the embedding, recorded under
    the model's one name and marked; the map accepts it and the full state takes chunk 0's entry."""
    from ds_hetero.checkpoint.layer_map import saved_entries

    first, last = _chunk(0, [0, 1], embed=True), _chunk(1, [2, 3], head=True)
    last["params"]["lm_head.weight"] = {"hf_name": f"{PREFIX}.embed_tokens.weight", "shape": [8, 4],
                                        "shared_copy": True}
    assert check_layer_map([first, last], [2, 2], "ckpt") is None
    assert "lm_head.weight" not in saved_entries(last) and "decoder.embed_tokens.weight" in saved_entries(first)
    # negative controls: unmarked, it is a parameter saved by two chunks; marked without the
    # first chunk's entry, a copy of nothing
    unmarked = {**last, "params": {**last["params"], "lm_head.weight": {
        k: v for k, v in last["params"]["lm_head.weight"].items() if k != "shared_copy"}}}
    assert "saved by chunks 0 and 1" in check_layer_map([first, unmarked], [2, 2], "ckpt")
    alone = {**first, "params": {k: v for k, v in first["params"].items() if "embed" not in k}}
    assert "no other chunk saves" in check_layer_map([alone, last], [2, 2], "ckpt")


def test_chunk_folders():
    assert chunk_folder(3) == "pp_03"
    assert part_dirs("ck", "language", 1) == ["ck/language"]
    assert part_dirs("ck", "language", 2) == ["ck/language/pp_00", "ck/language/pp_01"]


def _facts(pp=None, pp_layers=None):
    language = {"tp": 1, "cp": 1, "dp": 2, "ranks": [0, 1, 2, 3], "sequence_parallel": False}
    if pp is not None:
        language.update(pp=pp, pp_layers=pp_layers)
    return {"placement": "colocated", "world_size": 4, "zero_stage": 1, "dtype": "float32",
            "stages": {"language": language}}


def test_same_layout_compares_the_cut():
    # a manifest written before the pipeline keys equals a pp 1 engine
    assert same_layout(_facts(), _facts(pp=1, pp_layers=None))
    assert same_layout(_facts(pp=2, pp_layers=[2, 2]), _facts(pp=2, pp_layers=[2, 2]))
    assert not same_layout(_facts(pp=2, pp_layers=[1, 3]), _facts(pp=2, pp_layers=[2, 2]))
    assert not same_layout(_facts(), _facts(pp=2, pp_layers=[2, 2]))
    assert describe_layout(_facts(pp=2, pp_layers=[1, 3]), "language") == (
        "tp1 cp1 dp2 pp2 layers [1, 3] ranks [0, 1, 2, 3], colocated, ZeRO 1, float32")
    assert describe_layout(_facts(), "language") == "tp1 cp1 dp2 ranks [0, 1, 2, 3], colocated, ZeRO 1, float32"
