"""BoundaryCommunicator: runs a BoundaryPlan on tensors, as one autograd.Function.

    tensor       shape          placement
    rows         [n_in, H]      source rows of this rank: S over source dp, R over its tp x cp
                                group; [0, H] on a rank that holds none
    output       [n_out, H]     rows this destination rank needs, in destination order (the
                                order of `embeds[local_samples, shard][image_mask]`, see plan.py);
                                [0, H] on a rank that is no destination

    forward    one all_to_all_single over the boundary group with the plan's uneven splits, plus
               local copies of rows the rank already holds (colocated; never sent)
    backward   the same exchange reversed (splits swapped), restricted to the designated copy of
               each row no source replica holds a copy of, plus local copies (a replica holding
               a copy takes its gradient from it); then a completion all_to_all_single among the
               source replicas, only to those holding no copy, after which each holds the full,
               identical gradient (identical by the tp convention, see plan.py)
               (`once_differentiable`: the boundary is linear and its inputs are leaves or
               activations, double backward is not needed)

Every rank of the boundary group must call `exchange` for every micro-batch, in the same order,
with the same `BoundaryInputs`, and then either every rank runs backward through its output or
none does (on a rank without source rows, pass a `[0, H]` tensor with requires_grad=True).
Before the first collective, a rank that finds a problem only it can see (row count, hidden
size, dtype) makes every rank raise, through one small all-reduce: nobody is left hanging.
The device comes from the tensor and the backend from the group (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ..errors import HeteroConfigError
from ..topology.groups import HeteroGroups
from ..layout import StageLayout
from .inputs import BoundaryInputs, check_placement
from .plan import BoundaryPlan, Direction, RankPlan, build_plan

# A dtype's code in the consensus vector; ranks must agree on it (0: anything else).
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ExchangeStats:
    """What one exchange moved. Local counts are this rank's; totals and bound cover all ranks.

    `backward` says which exchange: the forward (rows) or the backward (gradients, completion
    included); the totals and the lower bound are those of the same direction.
    """

    rows_sent: int
    bytes_sent: int
    rows_received: int
    bytes_received: int
    row_bytes: int
    plan: BoundaryPlan = field(repr=False)
    backward: bool = False

    @property
    def total_bytes_sent(self) -> int:
        """Bytes all ranks send in this direction's exchange(s) (from the plan's send splits)."""
        p = self.plan
        return (p.backward_rows_sent() if self.backward else p.rows_sent()) * self.row_bytes

    @property
    def lower_bound_bytes(self) -> int:
        """Forward: every row some destination needs and does not hold, once per needing rank.
        Backward: every row gradient some source replica needs and holds no copy of, once per replica."""
        p = self.plan
        return (p.backward_lower_bound_rows() if self.backward else p.lower_bound_rows()) * self.row_bytes


@dataclass(frozen=True)
class _Moves:
    """A plan Direction with its index tensors on the device of the rows."""

    send_index: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_dest: torch.Tensor
    local_src: torch.Tensor
    local_dst: torch.Tensor
    n_out: int

    @classmethod
    def of(cls, d: Direction, device: torch.device) -> _Moves:
        def idx(xs):
            return torch.tensor(xs, dtype=torch.long, device=device)

        return cls(idx(d.send_index), list(d.send_splits), list(d.recv_splits), idx(d.recv_dest),
                   idx(d.local_src), idx(d.local_dst), d.n_out)


def _all_to_all(x: torch.Tensor, moves: _Moves, out: torch.Tensor, group, moves_rows: bool = True
                ) -> tuple[int, int]:
    """Send x[send_index] by splits, write what arrives to out[recv_dest]; returns rows (sent, received).

    `moves_rows` False: the plan sends nothing on any rank (every row is a local copy), which every
    rank knows from the same plan, so all of them skip the call alike.
    """
    sent, received = sum(moves.send_splits), sum(moves.recv_splits)
    if moves_rows and dist.get_world_size(group) > 1:  # a rank never sends to itself: one rank moves nothing
        send = x.index_select(0, moves.send_index)  # a fresh contiguous buffer, as gloo requires
        recv = x.new_empty((received, x.shape[1]))
        dist.all_to_all_single(recv, send, output_split_sizes=moves.recv_splits,
                               input_split_sizes=moves.send_splits, group=group)
        out.index_copy_(0, moves.recv_dest, recv)
    return sent, received


def _apply(x: torch.Tensor, moves: _Moves, group, moves_rows: bool = True) -> tuple[torch.Tensor, int, int]:
    """Local copies plus one all-to-all: a new [n_out, H] tensor."""
    out = x.new_empty((moves.n_out, x.shape[1]))
    if moves.local_dst.numel():
        out.index_copy_(0, moves.local_dst, x.index_select(0, moves.local_src))
    sent, received = _all_to_all(x, moves, out, group, moves_rows)
    return out, sent, received


@dataclass(frozen=True)
class _Route:
    """One rank's plan for one micro-batch, ready to run on one device."""

    plan: BoundaryPlan
    rank_plan: RankPlan
    forward: _Moves
    backward: _Moves
    completion: _Moves | None
    digest: int  # of (layouts, placement, inputs): ranks check they run the same plan
    # Whether any rank sends anything in the forward / backward (exchange or completion): from
    # the plan's lower bounds, which its rows sent equal, so every rank decides alike.
    forward_moves: bool = True
    backward_moves: bool = True


class _BoundaryExchange(torch.autograd.Function):
    """fwd: rows -> destination layout; bwd: local and designated gradient copies back, then completion."""

    @staticmethod
    def forward(ctx, rows, comm, route):
        ctx.comm, ctx.route = comm, route
        return comm._run_forward(rows, route)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        return ctx.comm._run_backward(grad_out, ctx.route), None, None


class BoundaryCommunicator:
    """Moves the boundary rows of `src` (vision) into the layout of `dst` (language) and back.

    One instance per stage pair, built on every rank of both stages; the plan of each
    micro-batch is cached per `BoundaryInputs` (the last `cache_size` of them).

    hidden_size, dtype   when given, every rank's rows are checked against them; in any case the
                         ranks must agree on them
    validate             the consensus all-reduce before the exchange (one tiny collective);
                         switch it off only when the inputs are known good
    """

    def __init__(self, src: StageLayout, dst: StageLayout, groups: HeteroGroups, placement: str | None = None,
                 *, hidden_size: int | None = None, dtype: torch.dtype | None = None,
                 validate: bool = True, cache_size: int = 8):
        self.src, self.dst = src, dst
        self.placement = check_placement(src, dst, placement)
        for layout in (src, dst):
            built = groups.stages[layout.name].layout
            # a pipelined destination is its first pipeline stage (StageLayout.chunk(0))
            if built != layout and not (built.pp > 1 and built.chunk(0) == layout):
                raise HeteroConfigError(
                    "stages", f"layout of {layout.name!r} differs from the one the groups were built for")
        self.rank = groups.stages[src.name].rank
        peers = tuple(sorted(set(src.ranks) | set(dst.ranks)))
        if self.rank not in peers:
            raise ValueError(f"rank {self.rank} holds neither {src.name!r} nor {dst.name!r}: it takes no part in "
                             "their exchanges (build a communicator only on the ranks of the pair)")
        # The exchange runs over the group of exactly this pair's ranks (build_groups makes one per
        # encoder stage): with several encoders on different ranks, the union would wait for ranks
        # that never join this pair's exchanges.
        try:
            self.group = groups.spanning(peers)
        except KeyError as exc:
            raise HeteroConfigError("stages", f"{exc.args[0]}; the stages {src.name!r} and {dst.name!r} need "
                                    "one") from None
        self.peers = peers
        # Source replicas hold identical rows; they complete each other's gradients.
        self.replica_group = groups.stages[src.name].model if src.contains(self.rank) else None
        # The plan indexes splits by sorted global rank: the groups must number ranks that way.
        for group in (self.group, self.replica_group):
            ranks = dist.get_process_group_ranks(group) if group is not None else []
            if ranks != sorted(ranks):
                raise ValueError("boundary groups must list their ranks in ascending order (build_groups does)")
        self.hidden_size, self.dtype, self.validate = hidden_size, dtype, validate
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self.last_forward: ExchangeStats | None = None
        self.last_backward: ExchangeStats | None = None

    # ------------------------------------------------------------------ public
    def exchange(self, rows: torch.Tensor, inputs: BoundaryInputs) -> torch.Tensor:
        """Differentiable: source rows [n_in, H] -> this rank's destination rows [n_out, H]."""
        route = self._prepare(rows, inputs)
        return _BoundaryExchange.apply(rows, self, route)

    def exchange_rows(self, rows: torch.Tensor, inputs: BoundaryInputs) -> torch.Tensor:
        """The forward alone, outside autograd (for schedules that send gradients explicitly)."""
        with torch.no_grad():
            return self._run_forward(rows, self._prepare(rows, inputs))

    def exchange_grads(self, grad_out: torch.Tensor, inputs: BoundaryInputs) -> torch.Tensor:
        """The backward alone: gradient of this rank's destination rows -> source gradient [n_in, H]."""
        route = self._route(inputs, grad_out.device)
        if self.validate:
            self._agree(grad_out, route.rank_plan.n_out, "gradient rows", route)
        with torch.no_grad():
            return self._run_backward(grad_out, route)

    def trust_inputs(self) -> None:
        """Stop the consensus all-reduce before each exchange: from now on the caller vouches that
        every rank passes the same inputs (the engine's batch agreement digests them each step)."""
        self.validate = False

    def plan(self, inputs: BoundaryInputs) -> BoundaryPlan:
        """The (cached) plan of a micro-batch; raises HeteroConfigError, identically on every rank."""
        return self._entry(inputs)["plan"]

    # ------------------------------------------------------------------ running
    def _run_forward(self, rows: torch.Tensor, route: _Route) -> torch.Tensor:
        out, sent, received = _apply(rows.contiguous(), route.forward, self.group, route.forward_moves)
        self.last_forward = self._stats(rows, sent, received, route)
        return out

    def _run_backward(self, grad_out: torch.Tensor, route: _Route) -> torch.Tensor:
        grad_in, sent, received = _apply(grad_out.contiguous(), route.backward, self.group, route.backward_moves)
        if route.completion is not None and route.backward_moves:
            s, r = _all_to_all(grad_in, route.completion, grad_in, self.replica_group)
            sent, received = sent + s, received + r
        self.last_backward = self._stats(grad_out, sent, received, route, backward=True)
        return grad_in

    @staticmethod
    def _stats(x: torch.Tensor, sent: int, received: int, route: _Route, backward: bool = False) -> ExchangeStats:
        row_bytes = x.shape[1] * x.element_size()
        return ExchangeStats(sent, sent * row_bytes, received, received * row_bytes, row_bytes, route.plan,
                             backward)

    # ------------------------------------------------------------------ plans and checks
    def _entry(self, inputs: BoundaryInputs) -> dict:
        if not isinstance(inputs, BoundaryInputs):
            inputs = BoundaryInputs(**inputs)
        entry = self._cache.get(inputs)
        if entry is None:
            plan = build_plan(self.src, self.dst, inputs, self.placement)
            text = repr((self.src, self.dst, self.placement, inputs)).encode()
            digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2
            entry = {"plan": plan, "rank_plan": plan.for_rank(self.rank), "digest": digest, "routes": {}}
            self._cache[inputs] = entry
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(inputs)
        return entry

    def _route(self, inputs: BoundaryInputs, device: torch.device) -> _Route:
        entry = self._entry(inputs)
        route = entry["routes"].get(device)
        if route is None:
            rp = entry["rank_plan"]
            completion = _Moves.of(rp.completion, device) if rp.completion is not None else None
            plan = entry["plan"]
            route = _Route(plan, rp, _Moves.of(rp.forward, device), _Moves.of(rp.backward, device), completion,
                           entry["digest"], plan.lower_bound_rows() > 0, plan.backward_lower_bound_rows() > 0)
            entry["routes"][device] = route
        return route

    def _prepare(self, rows: torch.Tensor, inputs: BoundaryInputs) -> _Route:
        route = self._route(inputs, rows.device)
        if self.validate:
            self._agree(rows, route.rank_plan.n_in, "rows", route)
        return route

    def _local_problem(self, x, n_rows: int, what: str) -> str | None:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return f"{what} must be a 2-D tensor [rows, hidden], got {getattr(x, 'shape', type(x))}"
        if x.shape[0] != n_rows:
            return (f"rank {self.rank} passed {x.shape[0]} {what} but the micro-batch's token_counts give it "
                    f"{n_rows} (the image tokens of its samples)")
        if self.hidden_size is not None and x.shape[1] != self.hidden_size:
            return f"rank {self.rank}: {what} have hidden size {x.shape[1]}, expected {self.hidden_size}"
        if self.dtype is not None and x.dtype != self.dtype:
            return f"rank {self.rank}: {what} have dtype {x.dtype}, expected {self.dtype}"
        if not x.is_floating_point():
            return f"rank {self.rank}: {what} must be floating point, got {x.dtype}"
        return None

    def _agree(self, x, n_rows: int, what: str, route: _Route) -> None:
        """One MAX all-reduce of [error, h, -h, dtype, -dtype, digest, -digest]: all ranks raise alike."""
        problem = self._local_problem(x, n_rows, what)
        ok = problem is None
        hidden = x.shape[1] if ok else 0
        code = _DTYPES.index(x.dtype) + 1 if ok and x.dtype in _DTYPES else 0
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        vec = torch.tensor([0 if ok else self.rank + 1, hidden, -hidden, code, -code, route.digest, -route.digest],
                           dtype=torch.long, device=device)
        dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=self.group)
        bad, h_max, h_min, c_max, c_min, d_max, d_min = (int(v) for v in vec.tolist())
        field = f"boundary.{what.replace(' ', '_')}"
        if problem is not None:
            raise HeteroConfigError(field, problem + "; no rank communicated")
        if bad:
            raise HeteroConfigError(
                field, f"rank {bad - 1} rejected its {what} (its error says why); no rank communicated")
        if d_max != -d_min:
            raise HeteroConfigError("boundary.inputs", "ranks passed different BoundaryInputs for the same exchange")
        if h_max != -h_min:
            raise HeteroConfigError(field, f"ranks disagree on the hidden size ({-h_min} vs {h_max})")
        if c_max != -c_min or c_max == 0:
            raise HeteroConfigError(field, f"ranks disagree on the dtype, or it is not one of {_DTYPES}")


def inputs_from_input_ids(input_ids: torch.Tensor, image_token_id: int, src_dp, dst_dp) -> BoundaryInputs:
    """BoundaryInputs of a padded micro-batch `input_ids [B, S]` (all samples, every rank)."""
    mask = (input_ids == image_token_id).cpu()
    positions = [torch.nonzero(row).flatten().tolist() for row in mask]
    return BoundaryInputs([len(p) for p in positions], src_dp, dst_dp, positions, int(input_ids.shape[1]))
