"""Training the user's model on a sharded graph with torch's own engine: the weights replicated and
their gradients averaged by ``DistributedDataParallel``, the loss over this rank's training rows
scaled so that the averaged gradients are the single-process ones, and metrics over all ranks.

    local = shard(data, ctx)
    model = replicate(model, ctx)                           # DDP
    loss = masked_loss(model(local.x, local.adj_t), local.y, local.train_mask, ctx)
    loss.backward(); optimizer.step()
    acc = masked_accuracy(out, local.y, local.test_mask)
"""
from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parameter import is_lazy
from torch.utils.weak import WeakIdKeyDictionary

from .context import ShardingContext, check_agreement


def replicate(model: torch.nn.Module, ctx: ShardingContext) -> DistributedDataParallel:
    """``model`` under ``DistributedDataParallel`` (rank 0's weights broadcast to all), on a process
    group of its own: its gradient all-reduces, which DDP starts during the backward pass, then
    never interleave with the graph's row exchanges on the sharding context's groups. Collective:
    call it on every rank.

    Dropout draws each rank's masks for its own rows, so training with it is statistically, not
    bitwise, the single-process training. Ranks seeded alike draw the same masks: row ``i`` of
    one row block and row ``i`` of the next are dropped together. To draw them apart, reseed per
    row block after this call, once everything that must be equal on every rank is drawn:
    ``torch.manual_seed(seed + ctx.block)`` (the replicas of a block, 1.5D, stay alike).

    Raises:
        ValueError: the model has a layer that cannot run on a sharded graph (an attention layer,
            a SAGEConv with another aggregation than the mean, a normalization over all nodes),
            named; or the ranks built different models (parameters of other shapes or dtypes: a
            model sized from features of another width), on every rank.
    """
    refuse_unshardable_layers(model)
    # lazy parameters have no shape yet: DDP refuses them itself, with its own advice
    params = [(tuple(p.shape), str(p.dtype)) for p in model.parameters() if not is_lazy(p)]
    check_agreement("replicating the model", [len(params), repr(params)],
                    ("parameters", "parameter shapes and dtypes (a hash)"), ctx.device,
                    "the ranks built different models; every rank must build the same model (same layers, widths "
                    "and dtypes: a model sized from the features needs the same features on every rank)")
    share_random_state_with_replicas(ctx)
    ctx.replicated = True
    group = dist.new_group(list(range(ctx.world_size)))
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # The gradients live in DDP's all-reduce buckets: one copy of them instead of two (no step
    # time measured either way on one H100: h100/distributed_1rank_ab.json); zero_grad() works.
    return DistributedDataParallel(model, device_ids=device_ids, process_group=group, gradient_as_bucket_view=True)


def share_random_state_with_replicas(ctx: ShardingContext) -> None:
    """Gives the ``r`` replicas of each row block (1.5D) the random state of the first one, so that
    they draw the same dropout masks. Each replica computes the same rows but the backward pass
    hands each a partial gradient that goes through its own masks: with different masks the summed
    gradient is not the loss's. Nothing to do in 1D. Collective; do not reseed per rank afterwards
    (seed every rank alike, or not at all; per row block, as :func:`replicate` says, is fine)."""
    group = ctx.row_group
    if group is None:
        return
    src = ctx.block * ctx.replication  # the block's first replica (global rank)
    generators = [(torch.get_rng_state, torch.set_rng_state)]
    if ctx.device.type == "cuda":
        generators.append((lambda: torch.cuda.get_rng_state(ctx.device),
                           lambda state: torch.cuda.set_rng_state(state, ctx.device)))
    for get_state, set_state in generators:
        state = get_state().to(ctx.device)  # NCCL sends device tensors only
        dist.broadcast(state, src, group=group)
        set_state(state.cpu())


def _mask(mask: torch.Tensor, out: torch.Tensor, what: str) -> torch.Tensor:
    """``mask`` checked: a bool tensor over this rank's rows (an index tensor would be summed as ids)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != out.shape[:1]:
        raise ValueError(f"{what}: the mask must be a bool tensor over this rank's {out.shape[0]} rows (shard(data, "
                         f"ctx).train_mask and the like), got {getattr(mask, 'dtype', type(mask).__name__)} of shape "
                         f"{tuple(getattr(mask, 'shape', ()))}; turn an index tensor of global ids into a mask of "
                         "the whole graph before shard()")
    return mask


def refuse_unshardable_layers(model: torch.nn.Module) -> None:
    """Raises ``ValueError`` naming the first layer of ``model`` that fgplugin cannot run on a
    sharded graph: a graph layer (PyG message passing or a DGL conv) that is not one of fgplugin's
    drop-in layers (convert the model first), a ``SAGEConv`` aggregating other than by the mean,
    and a normalization whose statistics span the nodes (each rank would take its own rows')."""
    for name, module in model.named_modules():
        why = _pyg_refusal(module) or _dgl_refusal(module) or _norm_refusal(module)
        if why:
            raise ValueError(f"layer {name!r} ({type(module).__name__}{why}")


def _pyg_refusal(module) -> str | None:
    conv = sys.modules.get("torch_geometric.nn.conv")
    if conv is None or not isinstance(module, conv.MessagePassing):  # without PyG imported no layer is one
        return None
    from fgplugin.pyg import GCNConv, LGConv, SAGEConv, SGConv

    if not isinstance(module, (GCNConv, SGConv, LGConv, SAGEConv)):
        return (") cannot run on a sharded graph: fgplugin shards GCNConv, SGConv, LGConv and SAGEConv (mean) of "
                "fgplugin.pyg; convert(model) swaps the stock ones, other layers need the whole graph")
    if isinstance(module, SAGEConv) and module.aggr != "mean":
        return f", aggr={module.aggr!r}) cannot run on a sharded graph: only the mean aggregation is sharded"
    return None


# PyG normalizations whose statistics are over all nodes (LayerNorm only in its "graph" mode)
_PYG_NODE_NORMS = ("BatchNorm", "InstanceNorm", "GraphNorm", "PairNorm", "MeanSubtractionNorm", "DiffGroupNorm",
                   "HeteroBatchNorm")


def _norm_refusal(module) -> str | None:
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, torch.nn.SyncBatchNorm):
        return (") takes its statistics over the rows of each rank on a sharded graph, not over all nodes: "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) makes it take them over all ranks")
    norm = sys.modules.get("torch_geometric.nn.norm")
    if norm is None or not type(module).__module__.startswith("torch_geometric.nn.norm"):
        return None
    if type(module).__name__ in _PYG_NODE_NORMS or (type(module).__name__ == "LayerNorm" and
                                                     getattr(module, "mode", None) == "graph"):
        return (") takes statistics over all nodes, which a sharded graph spreads over the ranks: fgplugin "
                "cannot run it sharded (torch.nn.SyncBatchNorm can stand in for a batch norm)")
    return None


def _dgl_refusal(module) -> str | None:
    if "dgl.nn.pytorch.conv" not in sys.modules or not type(module).__module__.startswith("dgl.nn.pytorch.conv"):
        if not type(module).__module__.startswith("fgplugin.dgl"):
            return None
        if getattr(module, "_aggre_type", "mean") != "mean":
            return (f", aggregator_type={module._aggre_type!r}) cannot run on a sharded graph: only the mean "
                    "aggregation is sharded")
        return None
    return (") cannot run on a sharded graph: fgplugin shards GraphConv, SAGEConv (mean) and SGConv of "
            "fgplugin.dgl; fgplugin.dgl.convert(model) swaps the stock ones, other layers need the whole graph")


def masked_loss(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, ctx: ShardingContext,
                loss_fn=F.cross_entropy) -> torch.Tensor:
    """This rank's share of ``loss_fn``'s mean over the rows ``mask`` selects on all ranks, for
    ``backward()`` under :func:`replicate`: ``sum(this rank's loss terms) * p / (r * N)`` with
    ``N`` the global count of loss terms (the entries of ``loss_fn(..., reduction="none")``: one
    per row for a class-index or soft-label cross entropy, one per row and column for a
    multi-label or regression loss, as ``reduction="mean"`` divides; a class-weighted or
    ``ignore_index`` loss, whose mean divides by other counts, is not such a mean). The
    all-reduced count is ``r * N``: replicas count their rows too. DDP averages the ranks'
    gradients (``/ p``), and the ``r`` replicas of a row block each hold a partial gradient of its
    rows (their sum is the true one), so the result is single-process training's gradient. One
    small all-reduce.

    The rows a mask selects are found on its first call (a host sync) and kept while it is the
    same tensor with the same ``_version``, so later steps do not sync. A mask changed where that
    counter does not see it (a collective writing into it, such as ``dist.broadcast(mask, 0)``;
    ``mask.data``; a NumPy view) keeps its old rows: pass a new tensor (``mask.clone()``) then."""
    mask = _mask(mask, out, "masked_loss")
    if not isinstance(y, torch.Tensor) or y.shape[:1] != out.shape[:1]:
        raise ValueError(f"masked_loss: y must hold one label (or row of targets) per row of out, this rank's "
                         f"{out.shape[0]} rows, got shape {tuple(getattr(y, 'shape', ()))}; pass the rank's own rows "
                         f"(shard(data, ctx).y), not the whole graph's")
    if not ctx.replicated and ctx.world_size > 1 and torch.is_grad_enabled() and out.requires_grad:
        _warn_unreplicated()
    rows = _selected_rows(mask, out.device)
    picked, target = out.index_select(0, rows), y.index_select(0, rows)
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    terms = loss_fn(picked, target, reduction="none")
    if terms.dim() == 0 and loss_fn(picked[:0], target[:0], reduction="none").dim() == 0:
        # a loss that reduces anyway (one row's terms may be squeezed to a scalar; none are, on no rows):
        # every rank finds the same, so all of them raise
        raise ValueError("masked_loss: loss_fn(out, y, reduction='none') returned a scalar; it must pass `reduction` "
                         "on to the loss, so that each selected row gives its own terms")
    # The count of loss terms, in float64 and summed in at least float32 (a 16-bit count overflows,
    # fp16: 65504, or rounds). Nothing above syncs the host once a mask's rows are kept, so the
    # all-reduce starts as soon as every rank's loss terms are computed.
    count = torch.full((1,), float(terms.numel()), dtype=torch.float64, device=out.device)  # a fill, no copy
    dist.all_reduce(count)
    local = terms.sum()
    return local * (ctx.world_size / count.clamp(min=1)[0]).to(local.dtype)


# Each mask's selected rows as an index, kept while the mask is the same tensor, unchanged (its
# _version): out[mask] syncs the host every step (a boolean index learns its row count there), so
# the host could not queue the step's backward until the forward had run, and the loss's count
# all-reduce waited for every rank's host to wake. The index is found once per mask instead. (As
# for the input cache, writes that skip the version counter, through mask.data or a NumPy view,
# go unseen.) mask -> (its _version, device, index); an entry goes with its mask.
_selected: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _selected_rows(mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The ids of the rows ``mask`` selects, on ``device``."""
    versioned = not mask.is_inference()  # an inference tensor has no version counter to tell a change by
    kept = _selected.get(mask) if versioned else None
    if kept is not None and kept[:2] == (mask._version, device):
        return kept[2]
    rows = mask.nonzero().squeeze(1).to(device)
    if versioned and not torch.is_inference_mode_enabled():  # an inference index: no later training step could save it
        _selected[mask] = (mask._version, device, rows)
    return rows


_warned_unreplicated = False


def _warn_unreplicated() -> None:
    global _warned_unreplicated
    if not _warned_unreplicated:
        _warned_unreplicated = True
        warnings.warn("fgplugin.distributed.masked_loss: no model was replicated on this sharding context, so each "
                      "rank would step on its own gradients and the ranks' weights drift apart. Wrap the model "
                      "with fgplugin.distributed.replicate(model, ctx); if you wrapped it in "
                      "DistributedDataParallel yourself, set ctx.replicated = True", UserWarning, stacklevel=3)


def global_mean(value_sum: torch.Tensor, count: torch.Tensor) -> float:
    """``sum(value_sum) / sum(count)`` over all ranks, replicas counted once."""
    both = torch.stack([value_sum.detach().double().reshape(()), count.detach().double().reshape(())])
    dist.all_reduce(both)
    return float(both[0] / both[1].clamp(min=1))


def masked_accuracy(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the rows ``mask`` selects on all ranks whose argmax of ``out`` is ``y``."""
    mask = _mask(mask, out, "masked_accuracy")
    return global_mean((out[mask].argmax(dim=-1) == y[mask]).sum(), mask.sum())


def gather_rows(local_rows: torch.Tensor, n_id: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Every rank's ``local_rows`` (its rows, in the order of ``n_id``: ``shard(...).n_id``) as one
    ``[num_nodes, ...]`` tensor in original node order, on every rank. Collective."""
    sizes = [torch.zeros(1, dtype=torch.long, device=local_rows.device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([local_rows.shape[0]], dtype=torch.long, device=local_rows.device))
    width = int(max(s.item() for s in sizes))
    pad = width - local_rows.shape[0]
    rows = torch.cat([local_rows, local_rows.new_zeros(pad, *local_rows.shape[1:])]) if pad else local_rows
    ids = torch.cat([n_id.to(local_rows.device), n_id.new_full((pad,), -1).to(local_rows.device)])
    all_rows = [torch.empty_like(rows) for _ in sizes]
    all_ids = [torch.empty_like(ids) for _ in sizes]
    dist.all_gather(all_rows, rows.contiguous())
    dist.all_gather(all_ids, ids)
    out = local_rows.new_zeros(num_nodes, *local_rows.shape[1:])
    for r, i in zip(all_rows, all_ids):
        keep = i >= 0
        out[i[keep]] = r[keep]  # replicas of a row block send the same rows
    return out
