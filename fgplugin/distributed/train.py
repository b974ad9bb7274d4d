"""Full-batch training across ranks: a GCN over fgplugin's one aggregation path, and a training
loop on ``DistributedDataParallel`` with global metrics, checkpoint and resume (the loss scaling
that makes DDP's averaged gradients the single-process ones is :func:`masked_loss`'s).
"""
from __future__ import annotations

import contextlib
import io
import math
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import parallel_dropout
from ..aggregation import aggregate
from ..cache import write_atomically
from .context import RankFailureError, timeout_seconds
from .ddp import global_mean, masked_accuracy, masked_loss, replicate
from .sharded_data import ShardedAdjacency
from .sharding import ShardedGraph

# 2: the ranks' random states, and a graph hash that a rewiring keeping every degree changes.
# Format 1 files (no random states, the older hash) still load: their graph is checked by size.
_CHECKPOINT_FORMAT = 2
_CHECKPOINT_KEYS = ("epoch", "model", "optimizer", "graph")


class DistGCN(nn.Module):
    r"""GCN (Kipf & Welling) of ``len(dims) - 1`` layers over any aggregation
    (fgplugin.aggregation): a :class:`ShardedGraph` across ranks, an
    :class:`fgplugin.aggregation.Aggregation` (``Aggregation.of(adj)``) in one process.

    Each layer is ``aggregate(graph, h, weight=W, bias=b)``, so it multiplies by ``W`` first when
    that narrows the features (less to aggregate and to send), and the first layer keeps its
    constant input's aggregation from the second step on (across ranks this removes the first
    layer's aggregations *and* their exchanges from every step; every rank decides alike while
    their ``x`` blocks are alike in size and their devices in memory, as block-wise row blocks on
    one kind of GPU are; a rank that decided otherwise would wait in a collective until the
    timeout and raise :class:`RankFailureError`). ReLU and dropout between layers.

    Args:
        dims: feature widths, e.g. ``(in, hidden, classes)``.
        dropout: dropout probability between layers (:func:`fgplugin.dropout`). Masks are drawn
            per rank, so training with ``dropout > 0`` is statistically, not bitwise, equal to
            single-process training.
    """

    def __init__(self, dims, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.dims = tuple(int(d) for d in dims)
        self.dropout = float(dropout)
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(a, b)) for a, b in zip(self.dims, self.dims[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in self.dims[1:]) if bias else None
        for w in self.weights:
            nn.init.xavier_uniform_(w)

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, w in enumerate(self.weights):
            if i:
                h = parallel_dropout.dropout(F.relu(h), self.dropout, self.training)
            h = aggregate(graph, h, weight=w, bias=None if self.biases is None else self.biases[i],
                          owner=self if i == 0 else None)
        return h


class DistributedTrainer:
    r"""Full-batch training of ``model`` on a :class:`ShardedGraph`, identical (up to float
    rounding) to training it in one process on the whole graph: a thin loop over torch's engine
    and fgplugin.distributed's helpers (:func:`replicate`: DDP; :func:`masked_loss`;
    :func:`global_mean`), with checkpoint and resume.

    Args:
        model: any module whose ``forward(graph, x)`` aggregates over ``graph`` (e.g. :class:`DistGCN`);
            it is wrapped in ``DistributedDataParallel`` (rank 0's weights broadcast at
            construction; ``trainer.model.module`` is yours).
        graph: this rank's :class:`ShardedGraph`, or the :class:`ShardedAdjacency` that
            ``shard_dgl`` / ``shard`` give (for a model of drop-in layers taking ``(graph, x)``).
        x, y: this rank's rows of features and labels (``graph.rows(...)``).
        train_mask: this rank's rows of the training mask; ``val_mask``, ``test_mask`` likewise
            (optional) for :meth:`evaluate`.
        optimizer: over ``model.parameters()``; its state stays replicated because every rank
            applies the same averaged gradients.

    A failed collective (a rank died, hung past the timeout, or diverged) raises
    :class:`RankFailureError` naming the timeout instead of hanging.
    """

    def __init__(self, model: nn.Module, graph: ShardedGraph | ShardedAdjacency, x, y, train_mask, optimizer, *,
                 val_mask=None, test_mask=None):
        if not isinstance(graph, (ShardedGraph, ShardedAdjacency)):
            raise TypeError(f"DistributedTrainer trains on this rank's ShardedGraph or ShardedAdjacency "
                            f"(ShardedGraph.from_edge_index, shard, shard_dgl), not a {type(graph).__name__}")
        self.graph, self.x, self.y, self.optimizer = graph, x, y, optimizer
        # What a checkpoint records of the graph (sizes and edge hashes) and of the sharding that
        # the ranks' random states belong to (ranks, replication, the node order's hash).
        fingerprint = (graph.base if isinstance(graph, ShardedAdjacency) else graph).fingerprint
        self._graph_id = fingerprint[:4]
        self._sharding = [graph.ctx.world_size, graph.ctx.replication, fingerprint[4]]
        self.masks = {"train": train_mask, "val": val_mask, "test": test_mask}
        self.epoch = 0
        with self._guard("setup"):
            self.model = replicate(model, graph.ctx)
            counts = torch.tensor([0 if m is None else int(m.sum()) for m in self.masks.values()],
                                  dtype=torch.long, device=graph.ctx.device)
            dist.all_reduce(counts)
        if int(counts[0]) == 0:
            raise ValueError("the training mask selects no node on any rank")

    def _guard(self, what: str):
        return _CollectiveGuard(what, self.graph.ctx.rank)

    def step(self, metrics: bool = True) -> dict[str, float]:
        """One full-batch epoch: forward, backward (DDP averages the gradients during it),
        optimizer step.

        Returns the global training loss and accuracy (one extra small all-reduce), or ``{}``
        when ``metrics=False`` (no host sync; what benchmarks time).
        """
        with self._guard(f"epoch {self.epoch}"):
            self.model.train()
            self.optimizer.zero_grad(set_to_none=False)
            out = self.model(self.graph, self.x)
            masked_loss(out, self.y, self.masks["train"], self.graph.ctx).backward()
            self.optimizer.step()
            self.epoch += 1
            if not metrics:
                return {}
            mask = self.masks["train"]
            logits, labels, count = out[mask].detach(), self.y[mask], mask.sum()
            loss = global_mean(F.cross_entropy(logits, labels, reduction="sum"), count)
            accuracy = global_mean((logits.argmax(dim=-1) == labels).sum(), count)
        return {"loss": loss, "train_acc": accuracy}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Global accuracy on each mask given (train, val, test)."""
        with self._guard("evaluate"):
            self.model.eval()
            out = self.model(self.graph, self.x)
            return {f"{k}_acc": masked_accuracy(out, self.y, m) for k, m in self.masks.items() if m is not None}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"format": _CHECKPOINT_FORMAT, "epoch": self.epoch, "model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(), "graph": list(self._graph_id)}

    def save_checkpoint(self, path) -> None:
        """Write weights, optimizer state, epoch and every rank's random state (CPU and GPU: a
        run resumed with the same sharding draws the dropout masks an uninterrupted one draws). The
        first three are replicated, so rank 0 writes the file (through a temporary file flushed to
        disk, then ``os.replace``: a crash never leaves a torn checkpoint). Returns after every
        rank got here; if rank 0 cannot write, every rank raises at once (rank 0 its error, the
        others a ``RuntimeError`` naming it)."""
        path, ctx = Path(path), self.graph.ctx
        with self._guard("save_checkpoint"), _on(ctx.device):
            rng = [None] * ctx.world_size
            dist.all_gather_object(rng, _rng_state(ctx.device))
        failure, error = [None], None
        if ctx.rank == 0:
            try:
                buffer = io.BytesIO()
                torch.save(_to_cpu({**self.state_dict(), "rng": rng, "sharding": self._sharding}), buffer)
                write_atomically(path, buffer.getvalue(), private=False)
            except Exception as err:  # noqa: BLE001 - told to every rank, then raised
                failure[0], error = f"{type(err).__name__}: {err}", err
        with self._guard("save_checkpoint"):
            dist.broadcast_object_list(failure, 0, device=ctx.device)
        if error is not None:
            raise error
        if failure[0] is not None:
            raise RuntimeError(f"rank 0, which writes the checkpoint for every rank, could not write {path} "
                               f"({failure[0]}); nothing was saved")

    def load_checkpoint(self, path, *, missing_ok: bool = False) -> int | None:
        """Resume from :meth:`save_checkpoint`'s file: rank 0 reads it and broadcasts it (no shared
        file system needed: only rank 0's copy counts, also for whether there is one). The
        sharding may differ from the run that wrote it; the graph may not. Each rank takes back its
        random state where the run that wrote the file had as many ranks, the same replication and
        the same node order (else a warning says the dropout masks will differ from an uninterrupted
        run's). A damaged file is refused on every rank before anything is applied. Returns the epoch
        to continue from, or ``None`` on every rank where rank 0 has no such file and ``missing_ok``
        (else every rank raises ``FileNotFoundError``)."""
        ctx, holder = self.graph.ctx, [None]
        if ctx.rank == 0:
            try:
                holder[0] = torch.load(path, map_location="cpu", weights_only=True)
            except FileNotFoundError:
                holder[0] = "missing"
            except Exception as err:  # noqa: BLE001 - told to every rank, not only to rank 0
                holder[0] = f"unreadable ({type(err).__name__}: {err})"
        with self._guard("load_checkpoint"):
            dist.broadcast_object_list(holder, 0, device=ctx.device)
        state = holder[0]
        if isinstance(state, str) and state == "missing":
            if missing_ok:
                return None
            raise FileNotFoundError(f"{path}: no checkpoint there on rank 0, which reads it for every rank")
        if isinstance(state, str):
            raise ValueError(f"{path} on rank 0 is {state}")
        self._check_checkpoint(path, state)
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])
        if state["format"] > 1 and list(state["sharding"]) == self._sharding:
            _set_rng_state(state["rng"][ctx.rank], ctx.device)
        else:
            written = "with another sharding (ranks, replication or node order)" if state["format"] > 1 else \
                "by an fgplugin that kept no random states (format 1)"
            warnings.warn(f"{path} was written {written}: the random states are not restored, so dropout draws "
                          f"other masks than an uninterrupted run would", stacklevel=2)
        return self.epoch

    def _check_checkpoint(self, path, state) -> None:
        """Raises ``ValueError`` for a file that is not a checkpoint of this graph."""
        if not isinstance(state, dict) or state.get("format") not in (1, _CHECKPOINT_FORMAT):
            what = f"format {state.get('format')!r}" if isinstance(state, dict) else f"a {type(state).__name__}"
            raise ValueError(f"{path}: not an fgplugin.distributed checkpoint ({what}); DistributedTrainer."
                             f"save_checkpoint writes them")
        keys = _CHECKPOINT_KEYS + (("rng", "sharding") if state["format"] > 1 else ())
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"{path}: an fgplugin.distributed checkpoint without {', '.join(missing)} (damaged?)")
        if not _checkpoint_fields_valid(state):
            raise ValueError(f"{path}: an fgplugin.distributed checkpoint whose epoch, model, optimizer, graph, random "
                             f"states or sharding are not what save_checkpoint writes (damaged?)")
        # format 1 hashed the edges otherwise: only its graph's sizes can be compared
        compared = 2 if state["format"] == 1 else 4
        if list(state["graph"])[:compared] != list(self._graph_id)[:compared]:
            raise ValueError(f"{path} was written for another graph (fingerprint {list(state['graph'])[:compared]} "
                             f"vs {list(self._graph_id)[:compared]} here)")


def _checkpoint_fields_valid(state: dict) -> bool:
    """Whether a checkpoint's fields have the types :meth:`DistributedTrainer.save_checkpoint`
    writes (checked before any is applied: a damaged file must not be half loaded, nor loaded on
    some ranks only)."""
    def ints(value, length):
        return isinstance(value, (list, tuple)) and len(value) == length and all(type(v) is int for v in value)

    if type(state["epoch"]) is not int or not isinstance(state["model"], dict) or \
            not isinstance(state["optimizer"], dict) or not ints(state["graph"], 4):
        return False
    if state["format"] == 1:
        return True
    rng = state["rng"]
    return ints(state["sharding"], 3) and isinstance(rng, list) and len(rng) == state["sharding"][0] and all(
        isinstance(r, dict) and isinstance(r.get("cpu"), torch.Tensor) and r["cpu"].dtype == torch.uint8 for r in rng)


def _on(device: torch.device):
    """The CUDA device context of ``device`` (NCCL's object collectives use the current device), or nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _rng_state(device: torch.device) -> dict:
    """This process's random state: torch's CPU generator (which fgplugin's CPU dropout draws
    its seeds from) and, on a GPU, that device's."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class _CollectiveGuard:
    """Turns a failed or timed-out collective into a :class:`RankFailureError` that says so."""

    def __init__(self, what: str, rank: int):
        self.what, self.rank = what, rank

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, (ValueError, TypeError, RankFailureError)):
            return False
        if isinstance(err, dist.DistError) or _looks_like_comm_failure(err):
            raise RankFailureError(
                f"rank {self.rank}: a collective failed during {self.what}: another rank died, hung or diverged "
                f"(collectives time out after {timeout_seconds():g} s: init_distributed(timeout=) or "
                f"$FGPLUGIN_DIST_TIMEOUT). Look at the other ranks' logs for the first error. Cause: "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        return False


def _looks_like_comm_failure(err: BaseException) -> bool:
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(s in text for s in (
        "connection closed", "connection reset", "timed out", "timeout", "nccl", "gloo", "broken pipe", "peer"))


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` (Frobenius), the error measure of docs/benchmarks.md."""
    denom = float(torch.linalg.vector_norm(b.double()))
    diff = float(torch.linalg.vector_norm(a.double() - b.double()))
    return diff / denom if denom else (0.0 if diff == 0 else math.inf)
