"""Process groups and block layout of row-wise sharding (docs/design.md, "Distributed").

``p`` ranks, replication ``r``, ``q = p / r`` row blocks. Rank ``g * r + k`` holds row block ``g``
(so the ``r`` replicas of a block are neighbours in rank order, usually on one host) and handles
the column blocks ``J_k = {j : j % r == k}``. Two kinds of groups:

- the *row group* of block ``g``: its ``r`` replicas, which all-reduce their partial products;
- the *column group* ``k``: the ``q`` ranks ``(0, k), (1, k), ...``, one per row block, which
  exchange the feature blocks of ``J_k`` (the owner of block ``j`` in that group is ``(j, k)``).

1D is ``r = 1`` (no row groups, one column group = the world).
"""
from __future__ import annotations

import os
import weakref
import zlib
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
# torch.distributed.nn.functional binds ``group=group.WORLD`` as default arguments when first
# imported, and torch._dynamo (which any optimizer imports) imports it. Imported after
# init_process_group, it keeps the default group alive past destroy_process_group() until
# interpreter exit, where destroying a gloo group can abort the process ("terminate called
# without an active exception"). Imported now, before any group exists, its defaults are None.
import torch.distributed.nn.functional  # noqa: F401

from ..config import dist_timeout_s

#: Collective timeout (seconds) used by :func:`init_distributed` unless one is passed;
#: ``FGPLUGIN_DIST_TIMEOUT`` overrides it. A dead or diverged rank surfaces as an error on the
#: others after at most this long (gloo usually reports a dead peer at once: its socket closes).
DEFAULT_TIMEOUT_S = 300.0

#: Exchange modes of :class:`ShardingContext` (``auto`` resolves to one of the others per graph).
COMM_MODES = ("auto", "broadcast", "sparse")


# torch >= 2.12 names the all-gather into one tensor all_gather_single (the old name warns).
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class RankFailureError(RuntimeError):
    """A collective failed or timed out: another rank died, hung, or diverged."""


def timeout_seconds() -> float:
    """Collective timeout of the default group, or the one :func:`init_distributed` would use."""
    if dist.is_initialized():
        try:
            group = dist.distributed_c10d._get_default_group()
            device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
            return group._get_backend(device).options._timeout.total_seconds()
        except (AttributeError, RuntimeError):  # private API moved: fall back to the configured value
            pass
    return dist_timeout_s(DEFAULT_TIMEOUT_S)


def init_distributed(backend: str | None = None, *, timeout: float | None = None) -> torch.device:
    """Initialize the default process group from torchrun's environment; returns this rank's device.

    NCCL with one GPU per process (``LOCAL_RANK``) when CUDA is available, gloo on CPU otherwise.
    ``timeout`` (seconds, default :data:`DEFAULT_TIMEOUT_S` or ``$FGPLUGIN_DIST_TIMEOUT``) bounds
    every collective, so a rank that dies makes the others fail instead of hanging. Does nothing
    but return the device when the group already exists.
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        seconds = timeout_seconds() if timeout is None else float(timeout)
        options = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=seconds), **options)
    return device


@dataclass(frozen=True)
class BlockLayout:
    """Node ranges of the ``q`` row blocks: block ``i`` is ``[i*n//q, (i+1)*n//q)``, the same
    ranges as ``fgplugin.reorder.reorder(..., parts=q)`` (Algorithm 2)."""

    num_nodes: int
    num_blocks: int

    def start(self, i: int) -> int:
        return i * self.num_nodes // self.num_blocks

    def end(self, i: int) -> int:
        return (i + 1) * self.num_nodes // self.num_blocks

    def size(self, i: int) -> int:
        return self.end(i) - self.start(i)


class ShardingContext:
    """Where this rank sits in a 1D (``replication=1``) or 1.5D sharding of the default group.

    Every rank must create it with the same arguments, in the same order relative to other
    process-group creation (``dist.new_group`` is collective).

    Args:
        replication: ``r``; must divide the world size ``p`` with ``r <= p / r`` (each replica
            needs at least one column block), e.g. ``p=4, r=2``.
        comm: ``"broadcast"`` (the paper's: the owner of a feature block broadcasts all of it; in
            1D one all-gather), ``"sparse"`` (each rank receives only the rows its non-zeros touch,
            point to point, in a ring-shift schedule, after gathering them into a send buffer) or
            ``"auto"`` (default): each graph picks one when it is sharded, sparse when the ranks
            read at most half of the other blocks' rows (see :mod:`fgplugin.distributed.sharding`).
        comm_dtype: dtype of the feature blocks on the wire (e.g. ``torch.bfloat16`` halves the
            traffic at bf16 rounding of the exchanged values); ``None`` sends them as they are.
    """

    def __init__(self, replication: int = 1, *, comm: str = "auto", comm_dtype: torch.dtype | None = None):
        if not dist.is_initialized():
            raise RuntimeError("fgplugin.distributed needs torch.distributed initialized first: call "
                               "fgplugin.distributed.init_distributed() (under torchrun) or "
                               "torch.distributed.init_process_group()")
        if comm not in COMM_MODES:
            raise ValueError(f"comm must be one of {COMM_MODES}, got {comm!r}")
        p, r = dist.get_world_size(), int(replication)
        if r < 1 or p % r != 0 or r > p // r:
            raise ValueError(f"replication r={replication} does not fit {p} ranks: r must divide p and "
                             f"r <= p/r (1.5D needs at least one column block per replica), e.g. p=4, r=2; "
                             f"use r=1 for 1D")
        self.world_size, self.replication, self.num_blocks = p, r, p // r
        self.rank = dist.get_rank()
        self.block, self.replica = divmod(self.rank, r)
        self.comm, self.comm_dtype = comm, comm_dtype
        # Set by replicate(); a model wrapped in DistributedDataParallel by the user: set it True.
        self.replicated = False
        self.backend = dist.get_backend()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        q = self.num_blocks
        # Every rank creates every group, in the same order (new_group is collective).
        row_group = None
        if r > 1:
            for g in range(q):
                group = dist.new_group([g * r + k for k in range(r)])
                if g == self.block:
                    row_group = group
        col_group, self.col_ranks = dist.group.WORLD, list(range(p))
        if r > 1:
            for k in range(r):
                ranks = [g * r + k for g in range(q)]
                group = dist.new_group(ranks)
                if k == self.replica:
                    col_group, self.col_ranks = group, ranks
        # The groups are held weakly: torch.distributed owns them until destroy_process_group(),
        # and a group object that outlives it (held here by a graph that lives to the end of the
        # script) is destroyed at interpreter exit instead, where gloo's aborts the process about
        # once in three runs of a 2-rank script ("terminate called without an active exception").
        self._row_group = None if row_group is None else weakref.ref(row_group)
        self._col_group = weakref.ref(col_group)
        # Column blocks this rank multiplies: those of its column group.
        self.col_blocks = [j for j in range(q) if j % r == self.replica]

    @property
    def row_group(self):
        """The process group of this rank's row block (its replicas), or ``None`` in 1D."""
        return None if self._row_group is None else self._group(self._row_group)

    @property
    def col_group(self):
        """The process group of this rank's column group (the world in 1D)."""
        return self._group(self._col_group)

    @staticmethod
    def _group(ref):
        group = ref()
        if group is None:
            raise RuntimeError("fgplugin.distributed: the process group of this ShardingContext was destroyed "
                               "(torch.distributed.destroy_process_group()); initialize again and build a new "
                               "ShardingContext and ShardedGraph")
        return group

    @property
    def scheme(self) -> str:
        return "1d" if self.replication == 1 else "1.5d"

    def owner(self, j: int) -> int:
        """Global rank that sends feature block ``j`` inside this rank's column group."""
        return self.col_ranks[j]

    def __repr__(self) -> str:
        return (f"ShardingContext({self.scheme}, p={self.world_size}, r={self.replication}, rank={self.rank} = "
                f"(block {self.block}, replica {self.replica}), column blocks {self.col_blocks}, comm={self.comm!r})")


def check_context(ctx, where: str) -> None:
    """Raises ``TypeError`` naming ``where`` when ``ctx`` is not a :class:`ShardingContext`."""
    if not isinstance(ctx, ShardingContext):
        raise TypeError(f"{where} takes this run's ShardingContext (ShardingContext(replication) after "
                        f"init_distributed()), got {type(ctx).__name__}")


# What a collective agreement check is about; ranks found at different ones have diverged.
_AGREEMENTS = ("building a sharded graph", "a layer's first call on a sharded graph", "replicating the model")


def check_agreement(what: str, values: list[int | str], names: tuple[str, ...], device, problem: str) -> None:
    """Collective over the default group: raises ``ValueError`` on every rank where the ranks'
    ``values`` (named by ``names``; a string is compared by its CRC-32, the same in every
    process) differ, saying ``problem`` and each differing value by rank; where some rank is at
    another check (``what``, one of ``_AGREEMENTS``: the ranks run different code), says that
    instead. One small all-gather of sizes, one of values, one host sync.

    Ranks that disagree on what they build or multiply would otherwise post collectives of
    different sizes, which gloo answers by aborting the process and NCCL by hanging until the
    timeout."""
    values = [zlib.crc32(v.encode()) if isinstance(v, str) else v for v in values]
    mine = torch.tensor([_AGREEMENTS.index(what), *values], dtype=torch.long, device=device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.long, device=device))
    width = max(int(t) for t in sizes)
    padded = torch.full((width,), -1, dtype=torch.long, device=device)
    padded[:mine.numel()] = mine
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    rows = [t.tolist() for t in gathered]
    if all(row == rows[0] for row in rows):
        return
    if len({row[0] for row in rows}) > 1:
        raise ValueError("fgplugin.distributed: the ranks are at different steps (" + ", ".join(
            f"rank {r} {_AGREEMENTS[row[0]]}" for r, row in enumerate(rows)) + "); every rank must run the same "
            "code: build the same sharded graphs and call the same model, on its rows of the same features, in "
            "the same order")
    diffs = []
    for i in range(1, width):
        column = [row[i] for row in rows]
        if len(set(column)) > 1:
            name = names[i - 1] if i - 1 < len(names) else f"entry {i - 1}"
            diffs.append(f"{name}: " + ", ".join(f"rank {r}={v}" for r, v in enumerate(column)))
    raise ValueError(f"fgplugin.distributed: {problem}. Differences: " + "; ".join(diffs))
