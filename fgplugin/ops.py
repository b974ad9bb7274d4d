"""``fgplugin.spmm``: the differentiable, torch.compile-able SpMM over a ``TiledAdjacency``.

The op ``torch.ops.fgplugin.spmm`` is defined in csrc/spmm.cpp (or, if the extension could not be
built, by fgplugin/_extension.py's fallback with the same schema); this module registers its fake
kernel and its autograd formula:

    out      = diag(r) (A + diag(d)) diag(c) x
    grad_x   = diag(c) (A^T + diag(d)) diag(r) g           the same op on A's transpose
    grad_val = SDDMM: <r_i g_i, c_j x_j> for each edge (i <- j)
    grad_r   = rowsum(g * (A + diag(d)) diag(c) x)
    grad_c   = rowsum(x * (A^T + diag(d)) diag(r) g),  grad_d = r * c * rowsum(g * x)

The backward pass calls the op itself with the forward and transpose arrays swapped, so double
backward works too.
"""
from __future__ import annotations

import torch

from . import grad_rows
from ._csr import aux_dtype_for
from .reference import sddmm_reference, spmm_reference
from .kernel_plan import kernel_plans
from .tiling import TiledAdjacency

SPMM_SCHEMA = ("spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, Tensor? col_scale, "
               "Tensor? diag, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, Tensor[] plan, Tensor[] t_plan) -> Tensor")
SDDMM_SCHEMA = "sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor"

_fallback_library = None  # keeps the Python-defined ops alive when the extension is missing


def define_reference_ops(cuda_only: bool = False) -> None:
    """Registers the reference kernels: for every device when the extension is missing, or
    for CUDA only when the extension was built without its CUDA kernels."""
    global _fallback_library
    if cuda_only:
        _fallback_library = torch.library.Library("fgplugin", "IMPL")
        _fallback_library.impl("spmm", spmm_reference, "CUDA")
        _fallback_library.impl("sddmm", sddmm_reference, "CUDA")
        return
    _fallback_library = torch.library.Library("fgplugin", "DEF")
    _fallback_library.define(SPMM_SCHEMA)
    _fallback_library.define(SDDMM_SCHEMA)
    for key in ("CPU", "CUDA"):
        _fallback_library.impl("spmm", spmm_reference, key)
        _fallback_library.impl("sddmm", sddmm_reference, key)


def register_python_parts() -> None:
    """Fake kernels and autograd for the ops (needs the schemas defined)."""
    torch.library.register_fake("fgplugin::spmm")(_spmm_fake)
    torch.library.register_fake("fgplugin::sddmm")(_sddmm_fake)
    torch.library.register_autograd("fgplugin::spmm", _spmm_backward, setup_context=_spmm_setup_context)
    if hasattr(torch.ops.fgplugin, "pad_columns"):  # CUDA builds: _CutColumns' backward may run compiled
        torch.library.register_fake("fgplugin::pad_columns")(_pad_columns_fake)


def _spmm_fake(rowptr, col, values, x, row_scale, col_scale, diag, t_rowptr, t_col, t_values, plan, t_plan):
    torch._check(x.dim() == 2, lambda: "fgplugin.spmm: x must be 2-D")
    return x.new_empty((rowptr.shape[0] - 1, x.shape[1]))


def _pad_columns_fake(x, width):
    return x.new_empty((x.shape[0], width))


def _sddmm_fake(rowptr, col, a, b):
    return a.new_empty((col.shape[0],), dtype=aux_dtype_for(a.dtype))


def _spmm_setup_context(ctx, inputs, output):
    rowptr, col, values, x, row_scale, col_scale, diag, t_rowptr, t_col, t_values, plan, t_plan = inputs
    ctx.save_for_backward(rowptr, col, values, x, row_scale, col_scale, diag, t_rowptr, t_col, t_values, *plan, *t_plan)
    ctx.plan_sizes = (len(plan), len(t_plan))


def _spmm_backward(ctx, grad):
    rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values, *plans = ctx.saved_tensors
    plan, t_plan = plans[:ctx.plan_sizes[0]], plans[ctx.plan_sizes[0]:]
    grads = _input_grads((rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values, plan, t_plan), grad,
                         ctx.needs_input_grad[2:7])
    no_grads = [None] * len(plan), [None] * len(t_plan)
    return (None, None, *grads, None, None, None, *no_grads)


class _SpmmFunction(torch.autograd.Function):
    """Eager autograd of the op, with the formula of its registered one (``_spmm_backward``).

    Why not only ``register_autograd``: torch.library flattens the plan lists (2 x 17 tensors)
    into autograd inputs on every call and back again in the backward pass, the largest
    fgplugin-only cost in a profile of a GCN step on cora (H100). Here the plans ride on ``ctx``
    as the cached constants they are (that step: 2.70 -> 2.5 ms; benchmarks/results/h100/
    step_overhead.json). Under torch.compile the op is called directly and traced with its
    registered autograd."""

    @staticmethod
    def forward(ctx, rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values, plan, t_plan):
        ctx.save_for_backward(rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values)
        ctx.plans = plan, t_plan
        return torch.ops.fgplugin.spmm.default(rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values, plan, t_plan)

    @staticmethod
    def backward(ctx, grad):
        plan, t_plan = ctx.plans
        grads = _input_grads((*ctx.saved_tensors, plan, t_plan), grad, ctx.needs_input_grad[2:7], skip_zero_rows=True)
        return (None, None, *grads, None, None, None, None, None)


def _call_spmm(*inputs):
    """The op with autograd: ``_SpmmFunction`` in eager mode, the op itself under torch.compile."""
    if torch.compiler.is_compiling():
        return torch.ops.fgplugin.spmm.default(*inputs)
    return _SpmmFunction.apply(*inputs)


def _input_grads(inputs, grad, need, skip_zero_rows: bool = False):
    """(grad_values, grad_x, grad_r, grad_c, grad_d) of the op called with ``inputs`` for the
    output gradient ``grad``; ``need`` says which (``None`` for the others). Its products are
    differentiable (``_call_spmm``), so double backward works. ``skip_zero_rows``: the adjoint
    product may leave out ``grad``'s zero rows (fgplugin.grad_rows; never in a double backward)."""
    rowptr, col, values, x, r, c, d, t_rowptr, t_col, t_values, plan, t_plan = inputs
    need_values, need_x, need_r, need_c, need_d = need
    aux = aux_dtype_for(x.dtype)
    grad_values = grad_x = grad_r = grad_c = grad_d = None
    if need_x or need_c:
        if t_rowptr is None:
            raise RuntimeError("fgplugin.spmm: the backward pass needs the transpose plan; call fgplugin.spmm(adj, x) "
                               "instead of torch.ops.fgplugin.spmm so that it is passed")
        restricted = None
        if skip_zero_rows:
            restricted = grad_rows.restrict_to_live_rows(t_rowptr, t_col, t_values, grad, t_plan)

        def adjoint(out_scale):
            if restricted is None:
                return _call_spmm(t_rowptr, t_col, t_values, grad, out_scale, r, d, rowptr, col, values, t_plan, plan)
            rowptr_kept, col_kept, values_kept, plan_kept = restricted
            return csr_product(rowptr_kept, col_kept, values_kept, grad, out_scale, r, d, plan_kept)

        if need_c:
            z = adjoint(None)
            grad_c = (z.to(aux) * x.to(aux)).sum(dim=1)
            grad_x = z * c.to(z.dtype).unsqueeze(1) if need_x else None
        else:
            grad_x = adjoint(c)
    if need_values:
        g_scaled = grad.to(aux) if r is None else grad.to(aux) * r.unsqueeze(1)
        x_scaled = x.to(aux) if c is None else x.to(aux) * c.unsqueeze(1)
        grad_values = torch.ops.fgplugin.sddmm.default(rowptr, col, g_scaled, x_scaled)
    if need_r:
        u = _call_spmm(rowptr, col, values, x, None, c, d, t_rowptr, t_col, t_values, plan, t_plan)
        grad_r = (grad.to(aux) * u.to(aux)).sum(dim=1)
    if need_d:
        n = d.shape[0]
        grad_d = (grad[:n].to(aux) * x[:n].to(aux)).sum(dim=1)
        if r is not None:
            grad_d = grad_d * r[:n]
        if c is not None:
            grad_d = grad_d * c[:n]
    return grad_values, grad_x, grad_r, grad_c, grad_d


def _as_aux(t, name, length, aux, device):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"fgplugin.spmm: {name} must be a 1-D tensor of length {length}, got "
                         f"{getattr(t, 'shape', type(t).__name__)}")
    if t.device != device:
        raise ValueError(f"fgplugin.spmm: {name} is on {t.device} but x is on {device}")
    return t.to(aux)


def spmm(adj: TiledAdjacency, x: torch.Tensor, row_scale=None, col_scale=None, diag=None) -> torch.Tensor:
    r"""Sparse-dense product :math:`\mathrm{diag}(r)\,(A + \mathrm{diag}(d))\,\mathrm{diag}(c)\,X`.

    Args:
        adj (TiledAdjacency): the graph, shape ``(num_dst, num_src)``.
        x (Tensor): ``[num_src, F]`` node features (float32/64, float16, bfloat16).
        row_scale, col_scale (Tensor, optional): ``[num_dst]`` and ``[num_src]`` scales.
        diag (Tensor or float, optional): self-loop weight per node (``[min(num_dst, num_src)]``),
            or one float for every node.

    ``fgplugin.spmm(adj, x, *adj.norm("gcn"))`` is a GCN aggregation. Differentiable in ``x``,
    the edge weights ``adj.values``, the scales and ``diag``; works under
    ``torch.compile(fullgraph=True)``. Returns ``[num_dst, F]`` in the dtype of ``x``.
    """
    return _product(adj, x, row_scale, col_scale, diag, adjoint=False)


def spmm_adjoint(adj: TiledAdjacency, g: torch.Tensor, row_scale=None, col_scale=None, diag=None) -> torch.Tensor:
    r"""The adjoint product :math:`\mathrm{diag}(c)\,(A^T + \mathrm{diag}(d))\,\mathrm{diag}(r)\,G`.

    This is the gradient of ``spmm(adj, x, row_scale, col_scale, diag)`` with respect to ``x`` for
    an output gradient ``g`` (``[num_dst, F]``), computed without the forward product (the
    block-adaptive plan of ``A^T``, cached on ``adj``). Arguments as for :func:`spmm`; returns
    ``[num_src, F]``. Differentiable like :func:`spmm`.
    """
    return _product(adj, g, row_scale, col_scale, diag, adjoint=True)


def spmm_vjp(adj: TiledAdjacency, x: torch.Tensor, grad: torch.Tensor, row_scale=None, col_scale=None, diag=None):
    """Gradients of ``spmm(adj, x, row_scale, col_scale, diag)`` for the output gradient ``grad``,
    without autograd (for code that runs where autograd is off, e.g. inside a custom op):
    ``(grad_values, grad_x, grad_row_scale, grad_col_scale, grad_diag)``, ``None`` for inputs that
    are ``None``. ``grad_values`` is in ``adj``'s CSR order (that of ``adj.values``); scales and
    ``diag`` must be tensors."""
    inputs, features, pad = _op_inputs(adj, x, row_scale, col_scale, diag, with_transpose=True, name="fgplugin.spmm_vjp")
    if pad:
        grad = torch.nn.functional.pad(grad, (0, pad))
    values, r, c, d = inputs[2], inputs[4], inputs[5], inputs[6]
    need = (values is not None, True, r is not None, c is not None, d is not None)
    grad_values, grad_x, grad_r, grad_c, grad_d = _input_grads(inputs, grad, need)
    return grad_values, grad_x[:, :features] if pad else grad_x, grad_r, grad_c, grad_d


def spmm_skipping_zero_rows(adj: TiledAdjacency, x: torch.Tensor, row_scale=None, col_scale=None, diag=None, *,
                            live: torch.Tensor | None = None) -> torch.Tensor:
    """``spmm(adj, x, ...)`` for a backward pass (no autograd), leaving out the columns of ``A``
    whose row of ``x`` is zero (:mod:`fgplugin.grad_rows`): with ``live=None`` where that pays by
    the rules of the zero-row skipping, given the bool mask ``live`` of ``x``'s non-zero rows
    always. The distributed backward multiplies its blocks with the gradient this way."""
    inputs, features, pad = _op_inputs(adj, x, row_scale, col_scale, diag, False, "fgplugin.spmm")
    rowptr, col, values, padded, r, c, d, plan = *inputs[:7], inputs[10]
    if live is None:
        restricted = grad_rows.restrict_to_live_rows(rowptr, col, values, padded, plan)
    else:
        restricted = grad_rows.restricted(rowptr, col, values, live, plan)
    if restricted is None:
        out = torch.ops.fgplugin.spmm.default(*inputs)
    else:
        rowptr_kept, col_kept, values_kept, plan_kept = restricted
        out = csr_product(rowptr_kept, col_kept, values_kept, padded, r, c, d, plan_kept)
    return out[:, :features].contiguous() if pad else out


def csr_product(rowptr, col, values, x, row_scale, col_scale, diag, plan: list) -> torch.Tensor:
    """The op on a bare CSR without its transpose: a product nothing will differentiate (the
    restricted products of the zero-row skipping). Scales and ``diag`` in ``x``'s aux dtype."""
    return torch.ops.fgplugin.spmm.default(rowptr, col, values, x, row_scale, col_scale, diag, None, None, None, plan,
                                           [])


def _product(adj, x, row_scale, col_scale, diag, adjoint: bool) -> torch.Tensor:
    name = "fgplugin.spmm_adjoint" if adjoint else "fgplugin.spmm"
    # The forward product needs the transpose only for a backward pass; the adjoint always does.
    with_transpose = adjoint or torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (x, adj.values, row_scale, col_scale, diag))
    inputs, features, pad = _op_inputs(adj, x, row_scale, col_scale, diag, with_transpose, name, adjoint)
    if adjoint:  # the x-gradient of the forward op for the output gradient x (the op's x slot is unused)
        out = _input_grads(inputs, inputs[3], (False, True, False, False, False))[1]
    else:
        out = _call_spmm(*inputs)
    return out[:, :features].contiguous() if pad else out


def _op_inputs(adj, x, row_scale, col_scale, diag, with_transpose: bool, name: str, adjoint: bool = False):
    """The op's 12 arguments for ``spmm(adj, x, ...)`` (checked, scales in the aux dtype, ``x``
    padded to whole 16-byte rows on CUDA), ``x``'s feature count and the padding."""
    if not isinstance(adj, TiledAdjacency):
        raise TypeError(f"{name} expects a TiledAdjacency, got {type(adj).__name__}; build one with "
                        "TiledAdjacency.from_edge_index(edge_index, num_nodes)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"{name}: x must be a 2-D floating-point tensor [num_nodes, F], got "
                         f"{getattr(x, 'dtype', type(x).__name__)} of shape {list(getattr(x, 'shape', []))}")
    n_rows, n_cols = adj.shape
    n_in = n_rows if adjoint else n_cols
    if x.shape[0] != n_in:
        side = "target" if adjoint else "source"
        raise ValueError(f"{name}: x has {x.shape[0]} rows but the adjacency has {n_in} {side} nodes "
                         f"(shape {adj.shape} = (num_dst, num_src)); pass features of every {side} node")
    if x.device != adj.device:
        raise ValueError(f"{name}: x is on {x.device} but the adjacency is on {adj.device}; "
                         f"move it with adj.to({str(x.device)!r})")
    aux = aux_dtype_for(x.dtype)
    n_diag = min(n_rows, n_cols)
    if isinstance(diag, (int, float)):
        diag = None if diag == 0 else adj.constant_diag(float(diag), aux)
    values = None if adj.values is None else adj.values.to(aux)
    row_scale = _as_aux(row_scale, "row_scale", n_rows, aux, x.device)
    col_scale = _as_aux(col_scale, "col_scale", n_cols, aux, x.device)
    diag = _as_aux(diag, "diag", n_diag, aux, x.device)
    t_rowptr = t_col = t_values = None
    if with_transpose:
        t_rowptr, t_col, _ = adj.transpose()
        t_values = None if values is None else adj.transposed_values(values)
    features, pad = x.shape[1], _vector_pad(x)
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    plan, t_plan = kernel_plans(adj, x, with_transpose)
    return (adj.rowptr, adj.col, values, x, row_scale, col_scale, diag, t_rowptr, t_col, t_values, plan,
            t_plan), features, pad


def _vector_pad(x: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Zero columns that make a CUDA ``x``'s rows whole 16-byte vectors (0 when they are), in
    ``dtype`` (default: ``x``'s).

    Why: the CUDA kernels gather a neighbour's row with 16-byte loads only when F is a multiple
    of 4 (fp32) or 8 (16-bit); otherwise every element is a 4-byte load. On reddit-like (H200)
    the F=41 SpMMs of a GCN's output layer took about as long as the F=128 ones. Padding costs
    two n x F copies; the backward pads the gradient the same way (autograd of pad and slice).
    Layers that make their input by a matmul avoid both by padding the weight instead
    (:func:`padded_width`)."""
    return padded_width(x.shape[1], x.dtype if dtype is None else dtype, x.device) - x.shape[1]


def aggregate_padded_product(aggregate, x: torch.Tensor, weight: torch.Tensor, width: int,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``aggregate(x @ weight) + bias`` for ``weight`` ``[in, out]``, with ``weight`` padded by
    zero columns to ``width`` (:func:`padded_width`, possibly of several dtypes) so that the
    product comes out as wide as the SpMM wants it; the result is cut back to ``out`` columns by
    the bias add (:class:`_CutColumns`)."""
    out = weight.shape[-1]
    if width == out:
        y = aggregate(x @ weight)
        return y if bias is None else y + bias
    return _CutColumns.apply(aggregate(x @ torch.nn.functional.pad(weight, (0, width - out))), out, bias)


class _CutColumns(torch.autograd.Function):
    """``z[..., :out] + bias`` (``bias`` may be ``None``), contiguous, with a backward pass that
    writes the padded gradient once (:func:`_pad_columns`) where autograd's slice backward
    fills a zero tensor and copies into it (products-like on an H100: a [2.45M, 48] write, about
    0.16 ms of a 14 ms training step). Written in the ``setup_context`` form, so ``torch.func``
    transforms work through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z, out, bias):
        cut = z[..., :out]
        return cut + bias if bias is not None else cut.contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output):
        z, out, bias = inputs
        ctx.pad = z.shape[-1] - out
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad):
        grad_z = _pad_columns(grad, ctx.pad)
        grad_bias = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(dim=0)
        return grad_z, None, grad_bias


def _pad_columns(grad: torch.Tensor, pad: int) -> torch.Tensor:
    """``grad`` with ``pad`` zero columns appended. On CUDA the extension's ``pad_columns`` kernel:
    torch's ``cat`` of products-like's [2.45M, 47] gradient with a zero column took 0.77 ms of a
    13 ms training step on an H100, over twice a plain copy of the same bytes
    (``benchmarks/cut_columns_probe.py``)."""
    if (grad.device.type == "cuda" and grad.dim() == 2 and hasattr(torch.ops.fgplugin, "pad_columns")
            and not torch._C._are_functorch_transforms_active()):  # the op has no vmap rule
        return torch.ops.fgplugin.pad_columns(grad, grad.shape[1] + pad)
    return torch.cat([grad, grad.new_zeros(*grad.shape[:-1], pad)], dim=-1)


def transform_with_bias(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``h @ weight + bias`` (``weight`` ``[in, out]``), as one ``addmm`` where it can be: on
    CUDA >= 12.1 cuBLASLt adds the bias in the GEMM's epilogue, which saves a read and a write of
    the output (products-like, an [2.45M, 64] output: 0.45 ms of a 14.3 ms training step on an
    H100). Elsewhere ``matmul`` and an add, as the stock layers compute it."""
    if bias is not None and h.dim() == 2 and weight.dim() == 2 and h.dtype == weight.dtype == bias.dtype:
        return torch.addmm(bias, h, weight)
    out = torch.matmul(h, weight)
    return out if bias is None else out + bias


def padded_width(features: int, dtype: torch.dtype, device: torch.device) -> int:
    """The width to which :func:`spmm` pads ``features`` columns of ``dtype`` on ``device``
    (whole 16-byte rows on CUDA; ``features`` itself elsewhere).

    A layer that computes ``spmm(adj, x @ W)`` can multiply by ``W`` padded with zero columns
    to this width and take the first ``features`` columns of the product: the op then gets
    whole vectors as they are, and neither pads its input nor cuts its output (two
    ``[n, features]`` copies in the forward pass, two in the backward)."""
    if torch.device(device).type != "cuda" or dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return features
    per_vector = 16 // dtype.itemsize
    return features + -features % per_vector
