"""Input checks with errors that say what was wrong, what was expected and how to fix it.

They run once when an adjacency is built (O(E), one host sync each), never in the training step.
"""
from __future__ import annotations

import torch

from .tile_density import check_threshold


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The data of a Tensor subclass as a plain tensor where it can be had (else the subclass)."""
    if type(tensor) is torch.Tensor:
        return tensor
    try:
        plain = tensor.as_subclass(torch.Tensor)
    except RuntimeError:
        plain = None
    if type(plain) is torch.Tensor:
        return plain
    # PyG's EdgeIndex keeps its data in a tensor of its own, which `as_tensor` returns: torch
    # 2.4-2.9 refuse `as_subclass` on it ("already associated to a python object of type
    # EdgeIndex"), 2.13 gives the EdgeIndex back.
    as_tensor = getattr(type(tensor), "as_tensor", None)
    data = as_tensor(tensor) if callable(as_tensor) else None
    return data if type(data) is torch.Tensor else (tensor if plain is None else plain)


def check_edge_index(edge_index) -> torch.Tensor:
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor of shape [2, E], got {type(edge_index).__name__}")
    edge_index = plain_tensor(edge_index)
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        raise TypeError("edge_index must be a dense [2, E] tensor; for a sparse adjacency use "
                        "TiledAdjacency.from_csr or from_scipy")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integer node ids (int64 or int32), got {edge_index.dtype}; "
                        "convert with edge_index.long()")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        hint = " (it looks like [E, 2]: pass edge_index.t())" if edge_index.dim() == 2 and edge_index.shape[1] == 2 else ""
        raise ValueError(f"edge_index must have shape [2, E] (row 0 = source, row 1 = target), got "
                         f"{list(edge_index.shape)}{hint}")
    edge_index = edge_index.long()
    if edge_index.numel() and int(edge_index.min()) < 0:
        where = int((edge_index < 0).any(dim=0).nonzero()[0])
        raise ValueError(f"edge_index holds a negative node id ({int(edge_index.min())}, first at edge {where}); "
                         "node ids must be in [0, num_nodes)")
    return edge_index


def check_edge_values(values, num_edges: int, name: str, device: torch.device, check_finite: bool = True) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a floating-point torch.Tensor of shape [{num_edges}], got {type(values).__name__}")
    values = plain_tensor(values)
    if not values.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point (float32 or float64), got {values.dtype}; use {name}.float()")
    if values.dim() != 1 or values.numel() != num_edges:
        raise ValueError(f"{name} must be 1-D with one entry per edge ({num_edges}), got shape {list(values.shape)}")
    if values.device != device:
        raise ValueError(f"{name} is on {values.device} but the edges are on {device}; move it with .to({str(device)!r})")
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()  # weights are kept in the accumulation precision
    if not check_finite:
        return values
    finite = torch.isfinite(values.detach())
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = int((~finite).nonzero()[0])
        raise ValueError(f"{name} has {bad} NaN or infinite entries (first at edge {first}); clean them, e.g. "
                         f"with torch.nan_to_num, before building the adjacency")
    return values


def check_csr(rowptr, col, shape):
    for name, t in (("rowptr", rowptr), ("col", col)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a 1-D int32 or int64 tensor")
    rowptr, col = plain_tensor(rowptr).long(), plain_tensor(col).long()
    if rowptr.device != col.device:
        raise ValueError(f"rowptr is on {rowptr.device} but col is on {col.device}")
    if rowptr.numel() == 0 or int(rowptr[0]) != 0 or int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr must start at 0 and end at nnz={col.numel()} (n_rows + 1 entries)")
    if bool((rowptr[1:] < rowptr[:-1]).any()):
        raise ValueError("rowptr must be non-decreasing")
    n_rows = rowptr.numel() - 1
    if shape is None:
        shape = (n_rows, n_rows)
    bad_shape = ValueError(f"shape must be (n_rows, n_cols), two non-negative integers, got {shape!r}")
    if isinstance(shape, (str, bytes)) or len(shape) != 2:
        raise bad_shape
    try:  # each entry as a node count is (an int, a NumPy integer, an integral 0-d tensor)
        shape = tuple(check_node_count(n, "shape") for n in shape)
    except (TypeError, ValueError):
        raise bad_shape from None
    if shape[0] != n_rows:
        raise ValueError(f"shape[0]={shape[0]} does not match rowptr, which describes {n_rows} rows")
    if col.numel() and (int(col.min()) < 0 or int(col.max()) >= shape[1]):
        raise ValueError(f"col holds ids outside [0, {shape[1]}): min {int(col.min())}, max {int(col.max())}; "
                         "pass shape=(n_rows, n_cols) large enough")
    return rowptr, col, shape


def check_node_count(value, name: str) -> int:
    """``value`` as a node count: a non-negative integer (an int, a NumPy integer or an integral
    0-d tensor), never a silently truncated float."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point \
            and value.dtype != torch.bool:
        value = int(value)
    if isinstance(value, (bool, torch.Tensor)) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a whole number of nodes (an int), got {value!r} of type "
                        f"{type(value).__name__}")
    value = value.__index__()
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_perm(perm, n: int, device: torch.device, what: str = "perm") -> torch.Tensor:
    """``perm`` as int64 on ``device`` if it is a permutation of 0..n-1 (``what`` names it in errors)."""
    meaning = "new -> old node ids" if what == "perm" else "positions"
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.numel() != n or perm.dtype.is_floating_point:
        raise ValueError(f"{what} must be a 1-D integer tensor of length {n} ({meaning})")
    perm = plain_tensor(perm).to(device=device, dtype=torch.long)
    seen = torch.zeros(n, dtype=torch.bool, device=device)
    if n and (int(perm.min()) < 0 or int(perm.max()) >= n or not bool(seen.index_fill_(0, perm, True).all())):
        raise ValueError(f"{what} must be a permutation of 0..{n - 1}; it has repeated or out-of-range ids")
    return perm


def check_tile_options(tile_size, threshold) -> None:
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size < 1:
        raise ValueError(f"tile_size must be a positive int (32 is the default and what the CUDA kernel tiles), got {tile_size!r}")
    check_threshold(threshold)


def refuse_spent_weights(values: torch.Tensor) -> torch.Tensor:
    """``values``, the CSR-ordered edge weights an adjacency indexed out of weights that need a
    gradient, with a hook on that indexing that raises a ValueError naming the fix where a later
    backward pass reaches it after an earlier one freed it: an adjacency built once from
    learnable weights and reused across training steps. Without it, that backward fails inside
    autograd with "Trying to backward through the graph a second time", which names neither the
    adjacency nor the fix. The hook runs only when a gradient reaches the values, so forward
    passes and gradients for other inputs are untouched, and a graph kept with
    ``retain_graph=True`` keeps working. It sits on the indexing's autograd node, not on the
    tensor, so saving the adjacency saves no hook."""
    if not values.requires_grad or values.grad_fn is None or torch.compiler.is_compiling():
        return values
    indexing = values.grad_fn  # the adjacency's own indexing, whose saved indices a backward frees
    if not hasattr(indexing, "_raw_saved_indices"):  # not an indexing node torch names this way: no hook
        return values

    def refuse_if_spent(grad_outputs):
        try:
            indexing._raw_saved_indices
        except RuntimeError:
            raise ValueError(
                "backward through an adjacency's edge weights that an earlier backward pass already went "
                "through: the adjacency was built once from weights that need a gradient and reused, and its "
                "copy of them serves one backward pass. Build the structure once without weights and give it "
                "the weights inside each step: adj = TiledAdjacency.from_edge_index(edge_index, num_nodes), "
                "then adj.with_values(edge_weight) in the step (a PyG layer given learnable edge weights "
                "does this when built with cached=False)") from None

    indexing.register_prehook(refuse_if_spent)
    return values
