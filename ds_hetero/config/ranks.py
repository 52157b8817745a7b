"""Which global ranks each stage runs on: colocated (all of them), disaggregated (disjoint sets), or
mixed (each encoder on the language stage's ranks or on ranks of its own) or first_stage (every
encoder on the ranks of the language's first pipeline stage)."""

from __future__ import annotations

from typing import Any

from ..errors import HeteroConfigError
from ..layout import StageLayout
from .schema import LANGUAGE, SECTION


def assign_ranks(specs: dict[str, dict[str, Any]], placement: str, world_size: int) -> dict[str, StageLayout]:
    sizes = {name: s["tp"] * s["cp"] * s["dp"] * s.get("pp", 1) for name, s in specs.items()}
    field = f"{SECTION}.stages"

    def explain(name):
        s = specs[name]
        if s.get("pp", 1) > 1:
            return f"tp x cp x dp x pp = {s['tp']} x {s['cp']} x {s['dp']} x {s['pp']} = {sizes[name]}"
        return f"tp x cp x dp = {s['tp']} x {s['cp']} x {s['dp']} = {sizes[name]}"

    for name, spec in specs.items():
        ranks = spec["ranks"]
        if ranks is None:
            continue
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad:
            raise HeteroConfigError(f"{field}.{name}.ranks", f"rank {bad[0]} is outside the world of {world_size} ranks (0..{world_size - 1})")
        if len(ranks) != sizes[name]:
            raise HeteroConfigError(f"{field}.{name}.ranks", f"lists {len(ranks)} ranks but {explain(name)}; make them agree")

    layouts: dict[str, StageLayout] = {}
    if placement == "mixed":
        return _mixed(specs, sizes, world_size, explain)
    if placement == "first_stage":
        return _first_stage(specs, sizes, explain, world_size)
    if placement == "colocated":
        everyone = tuple(range(world_size))
        for name, spec in specs.items():
            if sizes[name] != world_size:
                hint = (
                    "; stages on different ranks need placement \"disaggregated\""
                    if spec["ranks"] is not None else ""
                )
                raise HeteroConfigError(
                    f"{field}.{name}",
                    f"{explain(name)} but a colocated stage spans all {world_size} ranks; "
                    f"choose sizes whose product is {world_size}{hint}",
                )
        # Sizes equal the world and ranks are unique and in range, so any explicit "ranks"
        # is a permutation of the world: it only reorders the stage's coordinates.
        for name, spec in specs.items():
            layouts[name] = _layout(name, spec, spec["ranks"] or everyone)
        return layouts

    # Disaggregated: pairwise disjoint rank sets that together cover the world.
    named = {name: set(s["ranks"]) for name, s in specs.items() if s["ranks"] is not None}
    names = list(named)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = named[a] & named[b]
            if common:
                raise HeteroConfigError(
                    f"{field}.{b}.ranks",
                    f"shares ranks {sorted(common)} with stage {a!r}; disaggregated stages need disjoint ranks "
                    "(use placement \"colocated\" to put stages on the same ranks)",
                )
    total = sum(sizes.values())
    if total != world_size:
        detail = ", ".join(f"{n} {explain(n)}" for n in specs)
        raise HeteroConfigError(
            field,
            f"disaggregated stages need {total} ranks in all ({detail}) but the world has {world_size}; "
            f"make the stage sizes add up to {world_size}",
        )
    taken = set().union(*named.values()) if named else set()
    free = [r for r in range(world_size) if r not in taken]
    for name, spec in specs.items():  # stages without "ranks" take consecutive free ranks, in listed order
        if spec["ranks"] is None:
            ranks, free = tuple(free[: sizes[name]]), free[sizes[name]:]
        else:
            ranks = spec["ranks"]
        layouts[name] = _layout(name, spec, ranks)
    return layouts


def _mixed(specs, sizes, world_size: int, explain) -> dict[str, StageLayout]:
    """Every stage names its ranks (or spans the world); any two stages' rank sets are the same
    (colocated, e.g. vision on the language ranks) or disjoint (e.g. audio on ranks of its own);
    together they cover the world. A partial overlap has no boundary plan: it is refused."""
    field = f"{SECTION}.stages"
    everyone = tuple(range(world_size))
    ranks = {}
    for name, spec in specs.items():
        if spec["ranks"] is not None:
            ranks[name] = tuple(spec["ranks"])
        elif sizes[name] == world_size:
            ranks[name] = everyone
        else:
            raise HeteroConfigError(
                f"{field}.{name}.ranks", f"missing; with placement \"mixed\" a stage that does not span all "
                f"{world_size} ranks ({explain(name)}) lists its ranks: the language stage's ranks to colocate "
                "with it, or ranks of its own")
    names = list(specs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sa, sb = set(ranks[a]), set(ranks[b])
            if sa != sb and sa & sb:
                raise HeteroConfigError(
                    f"{field}.{b}.ranks",
                    f"{sorted(sb)} partly overlaps stage {a!r}'s ranks {sorted(sa)} (shared: {sorted(sa & sb)}); with "
                    "placement \"mixed\" two stages run on the same ranks (colocated) or on disjoint ranks")
    idle = sorted(set(everyone) - set().union(*map(set, ranks.values())))
    if idle:
        raise HeteroConfigError(field, f"ranks {idle} hold no stage; give every rank of the world a stage "
                                "(or launch fewer ranks)")
    return {name: _layout(name, spec, ranks[name]) for name, spec in specs.items()}


def _first_stage(specs, sizes, explain, world_size: int) -> dict[str, StageLayout]:
    """The language spans the world; every encoder takes exactly its first pipeline stage's ranks."""
    field = f"{SECTION}.stages"
    language = specs[LANGUAGE]
    if sizes[LANGUAGE] != world_size:
        raise HeteroConfigError(f"{field}.{LANGUAGE}", f"{explain(LANGUAGE)} but placement \"first_stage\" runs the "
                                f"language stage on all {world_size} ranks; choose sizes whose product is {world_size}")
    first = language["tp"] * language["cp"] * language["dp"]
    language_ranks = language["ranks"] or tuple(range(world_size))
    layouts = {}
    for name, spec in specs.items():
        if name == LANGUAGE:
            continue
        if sizes[name] != first:
            raise HeteroConfigError(
                f"{field}.{name}", f"{explain(name)}, but placement \"first_stage\" puts the encoder on the {first} "
                f"ranks of the language's first pipeline stage (tp x cp x dp); choose sizes whose product is {first}")
        if spec["ranks"] is not None:
            raise HeteroConfigError(f"{field}.{name}.ranks", "placement \"first_stage\" places the encoder on the "
                                    "language's first pipeline stage itself; remove the key")
        layouts[name] = _layout(name, spec, language_ranks[:first])
    layouts[LANGUAGE] = _layout(LANGUAGE, language, language_ranks)
    return {name: layouts[name] for name in specs}  # config order


def _layout(name: str, spec: dict[str, Any], ranks: tuple[int, ...]) -> StageLayout:
    return StageLayout(
        name=name, tp=spec["tp"], cp=spec["cp"], dp=spec["dp"], ranks=tuple(ranks),
        sequence_parallel=spec["sequence_parallel"], pp=spec.get("pp", 1),
        ep=spec.get("ep", 1),
    )

