"""``fgplugin.spmm``: the differentiable, torch.compile-able SpMM over a ``TiledAdjacency``.

The ops are defined in csrc/ (``torch.ops.fgplugin.*``; or, if the extension could not be built,
by :func:`define_reference_ops` with the same schemas and the pure-torch kernels of
fgplugin/reference.py). This module registers their fake kernels and their one autograd each,
used alike in eager mode and under torch.compile:

    out      = diag(r) (A + diag(d)) diag(c) x              [:, :width] + bias: the epilogue
    grad_x   = diag(c) (A^T + diag(d)) diag(r) g           the same op on A's transpose (g padded
                                                           back to x's columns); grad_bias = g
                                                           summed over its rows
    grad_val = SDDMM: <r_i g_i, c_j x_j> for each edge (i <- j)
    grad_r   = rowsum(g * (A + diag(d)) diag(c) x)
    grad_c   = rowsum(x * (A^T + diag(d)) diag(r) g),  grad_d = r * c * rowsum(g * x)

The backward pass calls the op itself with the forward and transpose arguments swapped, so double
backward works too; sddmm has its own autograd for the same reason. In eager mode without double
backward, the adjoint product leaves out the zero rows of its output gradient where that pays
(fgplugin.grad_rows).
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import torch
import torch.autograd.forward_ad
from torch.overrides import has_torch_function

from . import _extension, capture_holds, cusparse, grad_rows, repeated_calls
from ._csr import aux_dtype_for, rows_of_edges
from .config import settings
from .eager import any_requires_grad, plain_eager
from .inference_mode import outside_inference_mode
from .reference import (dense_tile_arch_reference, dropout_reference, nonzero_rows_reference, pad_columns_reference,
                        sddmm_reference, set_wgmma_reference, spmm_if_reference, spmm_reference)
from .tiling import TiledAdjacency

#: The ops' schemas, as csrc/<op>.cpp defines them (tests/test_extension.py checks they agree).
SCHEMAS = {
    "spmm": "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, Tensor? col_scale, "
            "Tensor? diag, Tensor? plan, int[] plan_layout, Tensor? t_rowptr, Tensor? t_col, Tensor? t_values, "
            "Tensor? t_plan, int[] t_plan_layout, Tensor? bias=None, int width=-1) -> Tensor",
    "sddmm": "sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor",
    "dropout": "dropout(Tensor x, float p, int seed) -> Tensor",
    "nonzero_rows": "nonzero_rows(Tensor x) -> Tensor",
    "pad_columns": "pad_columns(Tensor x, int width) -> Tensor",
    "spmm_if": "spmm_if(Tensor flag, Tensor rowptr, Tensor col, Tensor? values, Tensor x, Tensor? row_scale, "
               "Tensor? col_scale, Tensor? diag, Tensor(a!) out) -> ()",
    "set_wgmma": "set_wgmma(bool enabled) -> bool",
    "dense_tile_arch": "dense_tile_arch(int device) -> int",
}
_TENSOR_OPS = {"spmm": spmm_reference, "sddmm": sddmm_reference, "dropout": dropout_reference,
               "nonzero_rows": nonzero_rows_reference, "pad_columns": pad_columns_reference,
               "spmm_if": spmm_if_reference}
_fallback_library = None  # keeps the Python-defined ops alive when the extension is missing


def define_reference_ops(cuda_only: bool = False) -> None:
    """Registers the reference kernels: for every op and device when the extension is missing, or
    for CUDA tensors only when the extension was built without its CUDA kernels."""
    global _fallback_library
    if cuda_only:
        _fallback_library = torch.library.Library("fgplugin", "IMPL")
        for name, kernel in _TENSOR_OPS.items():
            if name != "dropout":  # the compiled op raises its own clear error on CUDA
                _fallback_library.impl(name, kernel, "CUDA")
        return
    _fallback_library = torch.library.Library("fgplugin", "DEF")
    for schema in SCHEMAS.values():
        _fallback_library.define(schema)
    for name, kernel in _TENSOR_OPS.items():
        for key in ("CPU", "CUDA"):
            _fallback_library.impl(name, kernel, key)
    _fallback_library.impl("set_wgmma", set_wgmma_reference, "CompositeExplicitAutograd")
    _fallback_library.impl("dense_tile_arch", dense_tile_arch_reference, "CompositeExplicitAutograd")


_autograd_library = None  # keeps the autograd registrations alive


def register_python_parts() -> None:
    """Fake kernels and autograd of the ops (needs the schemas defined)."""
    global _autograd_library
    torch.library.register_fake("fgplugin::spmm")(_spmm_fake)
    torch.library.register_fake("fgplugin::sddmm")(_sddmm_fake)
    torch.library.register_fake("fgplugin::nonzero_rows")(_nonzero_rows_fake)
    torch.library.register_fake("fgplugin::pad_columns")(_pad_columns_fake)
    torch.library.register_fake("fgplugin::spmm_if")(_spmm_if_fake)
    _autograd_library = torch.library.Library("fgplugin", "IMPL")
    for name, function, defaults in (("spmm", _SpmmAutograd, (None, -1)), ("sddmm", _SddmmAutograd, ())):
        _autograd_library.impl(name, _autograd_kernel(getattr(torch.ops.fgplugin, name).default, function, defaults),
                               "Autograd", with_keyset=True)
    for device_type in ("cpu", "cuda"):
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        _autograd_library.impl("spmm", _autocast_kernel(device_type, getattr(torch._C.DispatchKey, key)), key,
                               with_keyset=True)


def _autocast_kernel(device_type: str, dispatch_key):
    """spmm under ``torch.autocast``: float32 features are aggregated in the autocast dtype (bf16 or
    fp16, accumulated in float32 by the kernels); the edge weights and scales stay float32, which
    ``torch.library.register_autocast`` would cast too."""

    def kernel(_keyset, *args):
        x = args[3]
        if x.device.type == device_type:
            args = (*args[:3], _in_autocast_dtype(x), *args[4:])
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(dispatch_key)):
            return torch.ops.fgplugin.spmm.default(*args)

    return kernel


def _in_autocast_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` as autocast aggregates it: float32 features in the autocast dtype of their device."""
    if x.dtype == torch.float32:
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _autograd_kernel(op, function, defaults: tuple = ()):
    """The op's kernel at the Autograd key: ``function`` (a ``torch.autograd.Function`` whose
    ``forward`` takes the dispatch key set first) when a gradient is needed, else the op below
    autograd. This is what ``torch.library.register_autograd`` installs, less the argument
    defaulting it does on every call for its ``setup_context`` (``fill_defaults`` rebuilds the
    schema's argument list once per argument: 54 us of a 155 us spmm forward + backward on a
    small graph, 2-core CPU, torch 2.13). ``defaults``: the values of the schema's trailing
    arguments with defaults, which the dispatcher leaves out of a Python kernel's arguments where
    the caller left them at their default; ``function`` gets them filled in."""
    full = None if not defaults else len(op._schema.arguments)

    def kernel(keyset, *args):
        if full is not None and len(args) < full:
            args = (*args, *defaults[len(args) - full:])
        if torch.is_grad_enabled() and any_requires_grad(*args):
            return function.apply(keyset, *args)
        refuse_forward_ad(args)
        return _below_autograd(op, keyset, args)

    return kernel


def refuse_forward_ad(args) -> None:
    """Raises where forward-mode AD (``torch.autograd.forward_ad``, ``torch.func.jvp``) carries a
    tangent into an op that would otherwise run below autograd and drop it: the ops have no
    forward-mode derivative, and a silently zero tangent would be a wrong answer."""
    if torch.autograd.forward_ad._current_level < 0:
        return
    # torch.func.jvp's tangents show here too (on its wrapped arguments)
    if any(isinstance(t, torch.Tensor) and torch.autograd.forward_ad.unpack_dual(t).tangent is not None
           for t in args):
        raise NotImplementedError("fgplugin's products have no forward-mode derivative (torch.autograd.forward_ad, "
                                  "torch.func.jvp / jacfwd); differentiate in reverse mode (loss.backward(), "
                                  "torch.autograd.grad)")


def _below_autograd(op, keyset, args):
    """``op`` on ``args`` below the Autograd key: redispatched from the key set the dispatcher
    handed over, or (``keyset`` ``None``, the direct call of :func:`run_spmm`) called with autograd
    and autocast excluded (the caller applied autocast's cast)."""
    if keyset is None:
        if not torch._C._is_any_autocast_enabled():
            with torch._C._AutoDispatchBelowAutograd():
                return op(*args)
        with torch._C._AutoDispatchBelowAutograd(), torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)


_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.AutocastCUDA)


class OpArgs(NamedTuple):
    """The spmm op's arguments by name (the schema's order)."""

    rowptr: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor | None
    x: torch.Tensor
    row_scale: torch.Tensor | None
    col_scale: torch.Tensor | None
    diag: torch.Tensor | None
    plan: torch.Tensor | None
    plan_layout: tuple
    t_rowptr: torch.Tensor | None
    t_col: torch.Tensor | None
    t_values: torch.Tensor | None
    t_plan: torch.Tensor | None
    t_plan_layout: tuple
    bias: torch.Tensor | None = None  # the epilogue: added to every row of the first `width` columns kept
    width: int = -1

    def adjoint(self, g: torch.Tensor, out_scale: torch.Tensor | None) -> "OpArgs":
        """The arguments of ``diag(out_scale) (A^T + diag(d)) diag(r) g``: the op on A's transpose."""
        return OpArgs(self.t_rowptr, self.t_col, self.t_values, g, out_scale, self.row_scale, self.diag, self.t_plan,
                      self.t_plan_layout, self.rowptr, self.col, self.values, self.plan, self.plan_layout)

    def with_epilogue(self, bias: torch.Tensor | None, width: int) -> "OpArgs":
        """These arguments with ``bias`` and ``width``. Built field by field as :meth:`adjoint`
        is: the dynamo of torch 2.4-2.7 fails on ``_replace``, and that of 2.7 on slices of a NamedTuple."""
        return OpArgs(self.rowptr, self.col, self.values, self.x, self.row_scale, self.col_scale, self.diag, self.plan,
                      self.plan_layout, self.t_rowptr, self.t_col, self.t_values, self.t_plan, self.t_plan_layout,
                      bias, width)

    def call(self, needs_grad: bool | None = None) -> torch.Tensor:
        return run_spmm(self, needs_grad)


_MAKE_OP_ARGS = OpArgs._make  # from a sequence of all 16, without NamedTuple's keyword handling


class PreparedCall(NamedTuple):
    """A :func:`spmm` call as its checks decided it (fgplugin.repeated_calls keeps it): the op's
    arguments are ``(*head, x, row_scale, col_scale, diag, *tail, bias, width)``, ``x`` padded by
    ``pad`` zero columns, run by ``route`` (:func:`eager_route`); the scales, diagonal and bias
    come with each call (checked ones, or a float ``diag``)."""

    head: tuple
    tail: tuple
    width: int
    pad: int
    route: object

    def __call__(self, adj: TiledAdjacency, x: torch.Tensor, row_scale, col_scale, diag, bias) -> torch.Tensor:
        if diag is not None and not isinstance(diag, torch.Tensor):
            diag = _diag_vector(adj, diag, aux_dtype_for(x.dtype))
        if self.pad:
            x = torch.nn.functional.pad(x, (0, self.pad))
        args = (*self.head, x, row_scale, col_scale, diag, *self.tail, bias, self.width)
        return run_spmm(_MAKE_OP_ARGS(args), True, self.route)


def prepared_call(args: OpArgs, pad: int, route, given: tuple):
    """The kept form of a decided call (``args``, ``x`` padded by ``pad`` columns, run by
    ``route``; ``given``: the scales, diagonal and bias as the caller passed them): the
    extension's ``KeptSpmm`` (csrc/kept_call.cpp, which passes the kept arguments on in C++) for
    the routes it runs, a diagonal that comes as a tensor or not at all, and no argument with a
    ``__torch_function__`` of its own (C++ calls skip it), else a :class:`PreparedCall`. Both are
    called alike."""
    kept_spmm = _extension.kept_spmm
    diag = given[2]
    if (kept_spmm is not None and route in (_run_below_autograd, _run_wrt_x)
            and (diag is None or isinstance(diag, torch.Tensor)) and not has_torch_function(given)):
        return kept_spmm(*args[:3], *args[7:14], args.width, pad, route is _run_wrt_x)
    return PreparedCall(args[:3], args[7:14], args.width, pad, route)


def run_spmm(args: OpArgs, needs_grad: bool | None = None, route=None) -> torch.Tensor:
    """The op on ``args``: every product of this module goes through here, except a kept call
    that the extension's ``KeptSpmm`` runs (:func:`prepared_call`). ``needs_grad``: whether
    autograd must record the call, if the caller knows (else it is found out); ``route``: how
    to run it in plain eager mode, where a kept call (:class:`PreparedCall`) knows.

    In plain eager mode the op's autocast and autograd steps are taken here in Python instead of
    by the dispatcher, which would call back into their Python kernels (:func:`_autocast_kernel`,
    :func:`_autograd_kernel`) and box the 14 arguments each time: 5 us of a 10 us call on a
    small graph (2-core CPU, torch 2.13). Under torch.compile, functorch transforms, tensor
    subclasses and torch function or dispatch modes the op goes through the dispatcher."""
    if route is not None:
        return route(args)
    x = args.x
    if not plain_eager(x):
        return torch.ops.fgplugin.spmm.default(*args)
    if torch.is_autocast_enabled(x.device.type):
        args = args._replace(x=_in_autocast_dtype(x))
    if needs_grad is None:
        needs_grad = torch.is_grad_enabled() and any_requires_grad(*args)
    if not needs_grad:
        refuse_forward_ad(args)
    return eager_route(args, needs_grad)(args)


def eager_route(args: OpArgs, needs_grad: bool):
    """How plain eager mode runs the op on ``args`` (``x`` in the dtype it is multiplied in):
    below autograd, or recorded by the C++ node of ``spmm_wrt_x`` or by :class:`_SpmmAutograd`.
    The route takes the arguments as a sequence."""
    if not needs_grad:
        return _run_below_autograd
    if _wrt_x_alone(args):
        return _run_wrt_x
    return _run_autograd_function


def _run_below_autograd(args) -> torch.Tensor:
    return _below_autograd(torch.ops.fgplugin.spmm.default, None, args)


def _run_wrt_x(args) -> torch.Tensor:
    return torch.ops.fgplugin.spmm_wrt_x.default(*args)


def _run_autograd_function(args) -> torch.Tensor:
    return _FUNCTION_APPLY(None, *args)


def _wrt_x_alone(args: OpArgs) -> bool:
    """Whether the backward of a product that needs a gradient is the adjoint product for ``x``
    alone, which the extension's ``spmm_wrt_x`` op (csrc/spmm_wrt_x.cpp) records with an autograd
    node in C++ instead of :class:`_SpmmAutograd`: ``x`` is the only input that needs a gradient,
    the transpose is passed, and the zero-row skipping cannot apply (the products of small graphs,
    whose steps are bound by host time: a product and its backward on a 64-node graph took 54 us
    against 72 with the Python node, 2-core CPU)."""
    return (_extension.status.loaded and args.t_rowptr is not None and args.x.requires_grad
            and not any_requires_grad(args.values, args.row_scale, args.col_scale, args.diag)
            and not grad_rows.may_apply(args.t_col.numel(), args.x.shape[1], args.x.device.type)
            and torch.autograd.forward_ad._current_level < 0)  # forward AD: C++ nodes have no jvp


def _spmm_fake(rowptr, col, values, x, row_scale, col_scale, diag, plan, plan_layout, t_rowptr, t_col, t_values,
               t_plan, t_plan_layout, bias=None, width=-1):
    torch._check(x.dim() == 2, lambda: "fgplugin.spmm: x must be 2-D")
    return x.new_empty((rowptr.shape[0] - 1, x.shape[1] if width < 0 else width))


def _sddmm_fake(rowptr, col, a, b):
    return a.new_empty((col.shape[0],), dtype=aux_dtype_for(a.dtype))


def _nonzero_rows_fake(x):
    return x.new_empty((x.shape[0],), dtype=torch.bool)


def _spmm_if_fake(flag, rowptr, col, values, x, row_scale, col_scale, diag, out):
    return None


def _pad_columns_fake(x, width):
    return x.new_empty((x.shape[0], width))


# ---------------------------------------------------------------------- spmm's autograd
class _SpmmAutograd(torch.autograd.Function):
    """The spmm op's autograd (registered at its Autograd key by :func:`register_python_parts`)."""

    @staticmethod
    def forward(ctx, keyset, *inputs):
        ctx.layouts = inputs[8], inputs[13]  # the plan layouts (int lists), not tensors
        ctx.features = inputs[3].shape[1]  # an output cut to `width` columns gets its gradient padded back
        bias = inputs[14]
        ctx.bias_dtype = None if bias is None else bias.dtype
        saved = list(inputs[:8])
        # x enters the gradients of the edge values, the scales and diag (input_grads), not its
        # own: not saved for that alone, so that writing to x after the product is no error
        if not any(ctx.needs_input_grad[i] for i in (3, 5, 6, 7)):  # values, row_scale, col_scale, diag
            saved[3] = None
        ctx.save_for_backward(*saved, *inputs[9:13])
        return _below_autograd(torch.ops.fgplugin.spmm.default, keyset, inputs)

    @staticmethod
    def backward(ctx, grad):
        saved = list(ctx.saved_tensors)
        grads = (None,) * 5
        if any(ctx.needs_input_grad[3:8]):  # not where the bias alone needs a gradient
            args = OpArgs(*saved[:8], ctx.layouts[0], *saved[8:], ctx.layouts[1])  # the product without its epilogue
            grads = input_grads(args, padded_columns(grad, ctx.features), ctx.needs_input_grad[3:8],
                                skip_zero_rows=True)
        grad_bias = column_sum(grad, ctx.bias_dtype) if ctx.needs_input_grad[15] else None
        return (None, None, None, *grads) + (None,) * 7 + (grad_bias, None)


_COLUMN_SUM_GEMM_NUMEL = 1 << 22


def column_sum(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``g.sum(dim=0)`` in ``dtype`` (a bias gradient): a float32 CUDA matrix goes through a GEMM
    with a row of ones, which reads it at the memory's speed where torch's reduction over rows did
    not (H100, [233K, 128]: 0.21 ms against 0.05; [2.45M, 64]: 0.30 against 0.22;
    benchmarks/results/h100/column_sum.json). 16-bit gradients keep the reduction, which sums them
    into float32 (the GEMM would round its result to 16 bits), and so do small ones, where the
    row of ones would only add a kernel launch (the two took about the same time at [233K, 41]),
    strided ones (cuBLAS would get a copy), and any where float32 matmuls may run in TF32 (its
    10-bit mantissa would lose the sum of a gradient whose entries cancel)."""
    if (g.is_cuda and g.dim() == 2 and g.numel() >= _COLUMN_SUM_GEMM_NUMEL and g.dtype == dtype == torch.float32
            and g.is_contiguous() and not torch.is_autocast_enabled("cuda")
            and torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32):
        return torch.mm(g.new_ones(1, g.shape[0]), g).squeeze(0)
    return g.sum(dim=0, dtype=dtype)


# _SpmmAutograd.apply less its Python wrapper's pass over the arguments (it unwraps functorch's dead
# wrappers, which plain eager mode has none of): torch's C apply, bound to the class; ~10 us of a
# 14-argument call
_FUNCTION_APPLY = super(torch.autograd.Function, _SpmmAutograd).apply


def input_grads(args: OpArgs, grad: torch.Tensor, need, skip_zero_rows: bool = False):
    """(grad_values, grad_x, grad_r, grad_c, grad_d) of the op called with ``args`` for the output
    gradient ``grad``; ``need`` says which (``None`` for the others). Its products are the op
    itself, so double backward works. ``skip_zero_rows``: the adjoint product may leave out
    ``grad``'s zero rows (fgplugin.grad_rows decides; never in a double backward or when compiled)."""
    need_values, need_x, need_r, need_c, need_d = need
    x, r, c, d = args.x, args.row_scale, args.col_scale, args.diag  # x may be None where no gradient reads it
    aux = aux_dtype_for((grad if x is None else x).dtype)  # grad has the product's dtype, x's
    grad_values = grad_x = grad_r = grad_c = grad_d = None
    if need_x or need_c:
        if args.t_rowptr is None:
            raise RuntimeError("fgplugin.spmm: the backward pass needs the transpose; call fgplugin.spmm(adj, x) "
                               "instead of torch.ops.fgplugin.spmm so that it is passed")

        def adjoint(out_scale):
            def full():
                return args.adjoint(grad, out_scale).call()

            if not skip_zero_rows:
                return full()
            return _adjoint_over_live_rows(args.t_rowptr, args.t_col, args.t_values, args.t_plan, grad, out_scale, r,
                                           d, full)

        if need_c:
            z = adjoint(None)
            grad_c = (z.to(aux) * x.to(aux)).sum(dim=1)
            grad_x = z * c.to(z.dtype).unsqueeze(1) if need_x else None
        else:
            grad_x = adjoint(c)
    if need_values:
        g_scaled = grad.to(aux) if r is None else grad.to(aux) * r.unsqueeze(1)
        x_scaled = x.to(aux) if c is None else x.to(aux) * c.unsqueeze(1)
        grad_values = torch.ops.fgplugin.sddmm.default(args.rowptr, args.col, g_scaled, x_scaled)
    if need_r:
        u = args._replace(row_scale=None).call()
        grad_r = (grad.to(aux) * u.to(aux)).sum(dim=1)
    if need_d:
        n = d.shape[0]
        grad_d = (grad[:n].to(aux) * x[:n].to(aux)).sum(dim=1)
        if r is not None:
            grad_d = grad_d * r[:n]
        if c is not None:
            grad_d = grad_d * c[:n]
    return grad_values, grad_x, grad_r, grad_c, grad_d


# ---------------------------------------------------------------------- sddmm's autograd
class _SddmmAutograd(torch.autograd.Function):
    """out[e] = <a[i], b[j]> for e = (i, j): grad_a[i] = sum_e grad[e] b[j], grad_b[j] = sum_e
    grad[e] a[i]; in torch ops (index_add), themselves differentiable. Only second derivatives of
    spmm with respect to its edge values come here."""

    @staticmethod
    def forward(ctx, keyset, rowptr, col, a, b):
        ctx.save_for_backward(rowptr, col, a, b)
        return _below_autograd(torch.ops.fgplugin.sddmm.default, keyset, (rowptr, col, a, b))

    @staticmethod
    def backward(ctx, grad):
        rowptr, col, a, b = ctx.saved_tensors
        rows, cols = rows_of_edges(rowptr, col.numel()), col.long()
        g = grad.unsqueeze(1)
        grad_a = grad_b = None
        if ctx.needs_input_grad[3]:
            grad_a = torch.zeros(a.shape, dtype=g.dtype, device=a.device).index_add_(0, rows, g * b[cols].to(g.dtype))
            grad_a = grad_a.to(a.dtype)
        if ctx.needs_input_grad[4]:
            grad_b = torch.zeros(b.shape, dtype=g.dtype, device=b.device).index_add_(0, cols, g * a[rows].to(g.dtype))
            grad_b = grad_b.to(b.dtype)
        return None, None, None, grad_a, grad_b


# ---------------------------------------------------------------------- the public products
@outside_inference_mode
def spmm(adj: TiledAdjacency, x: torch.Tensor, row_scale=None, col_scale=None, diag=None, *, bias=None,
         width: int | None = None) -> torch.Tensor:
    r"""Sparse-dense product :math:`\mathrm{diag}(r)\,(A + \mathrm{diag}(d))\,\mathrm{diag}(c)\,X`.

    Args:
        adj (TiledAdjacency): the graph, shape ``(num_dst, num_src)``.
        x (Tensor): ``[num_src, F]`` node features (float32/64, float16, bfloat16).
        row_scale, col_scale (Tensor, optional): ``[num_dst]`` and ``[num_src]`` scales.
        diag (Tensor or float, optional): self-loop weight per node (``[min(num_dst, num_src)]``),
            or one float for every node.
        bias (Tensor, optional): ``[width]`` (``[F]`` without ``width``), added to every row of
            the result. The block-adaptive CUDA kernels add it in their output pass, which saves a
            pass over the result (a layer's bias add).
        width (int, optional): keep only the first ``width`` columns of the result, cut in the
            same pass: for a caller that padded ``x`` with zero columns to a whole number of
            16-byte vectors, which the CUDA kernels read faster.

    ``fgplugin.spmm(adj, x, *adj.norm("gcn"))`` is a GCN aggregation. Differentiable in ``x``,
    the edge weights ``adj.values``, the scales, ``diag`` and ``bias`` (twice, too); works under
    ``torch.compile(fullgraph=True)``. Returns ``[num_dst, width or F]`` in the dtype of ``x`` (under
    ``torch.autocast``, the autocast dtype).
    """
    prepared = repeated_calls.find(adj, x, row_scale, col_scale, diag, bias, width)
    if prepared is not None:  # a call like an earlier one: its checks and choices hold (fgplugin.repeated_calls)
        return prepared(adj, x, row_scale, col_scale, diag, bias)
    checked = checked_inputs(adj, x, row_scale, col_scale, diag, "fgplugin.spmm")  # before anything reads adj
    # The forward product needs the transpose only for a backward pass.
    with_transpose = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (x, adj.values, row_scale, col_scale, diag))
    given = (row_scale, col_scale, diag)  # as passed: what a kept cuSPARSE fold is found by
    checked_bias, checked_width = bias, width
    if bias is not None or width is not None:
        checked_bias, checked_width = checked_epilogue(x, bias, width, "fgplugin.spmm")
    on_cusparse = settings.cusparse != "0" and cusparse.runs(adj, x, *checked, checked_product, given)
    if on_cusparse:
        restricted = _restricted_adjoint(adj, *checked, x.shape[1]) if with_transpose else None
        out = cusparse.product(adj, x, *checked, given, restricted)
        out = out if checked_width is None else _cut(out, checked_width)
        return out if checked_bias is None else out + checked_bias
    args, needs_grad = _product_args(adj, x, *checked, with_transpose, checked_bias, checked_width)
    if on_cusparse is None or not repeated_calls.context_allows(x):  # None: the next call chooses the route
        return args.call(needs_grad)
    prepared = prepared_call(args, args.x.shape[1] - x.shape[1], eager_route(args, needs_grad),
                             (row_scale, col_scale, diag, bias))
    repeated_calls.keep(adj, x, row_scale, col_scale, diag, bias, width, prepared, (*checked, checked_bias))
    return prepared(adj, x, *checked, checked_bias)


def checked_product(adj: TiledAdjacency, x: torch.Tensor, row_scale, col_scale, diag,
                    with_transpose: bool = False, bias=None, width: int | None = None) -> torch.Tensor:
    """:func:`spmm` on fgplugin's kernels, for arguments :func:`checked_inputs` and
    :func:`checked_epilogue` returned (``width`` ``None``: all of ``x``'s columns)."""
    args, needs_grad = _product_args(adj, x, row_scale, col_scale, diag, with_transpose, bias, width)
    return args.call(needs_grad)


def _product_args(adj: TiledAdjacency, x: torch.Tensor, row_scale, col_scale, diag, with_transpose: bool,
                  bias, width: int | None) -> tuple[OpArgs, bool]:
    """The op's arguments of :func:`checked_product` and whether autograd must record the call."""
    args, features = _op_args_of_checked(adj, x, row_scale, col_scale, diag, with_transpose)
    width = features if width is None else width
    needs_grad = with_transpose or (bias is not None and bias.requires_grad and torch.is_grad_enabled())
    if width == args.x.shape[1]:
        if bias is None:
            return args, with_transpose
        width = -1  # nothing to cut: no int for torch.compile to specialize a dynamic width on
    return args.with_epilogue(bias, width), needs_grad


def checked_epilogue(x: torch.Tensor, bias, width, name: str) -> tuple:
    """``(bias, width)`` of ``spmm(..., bias=bias, width=width)`` for a checked ``x``: ``width``
    the output's columns (``x``'s without it), ``bias`` in ``x``'s aux dtype; raises a ValueError
    naming the problem."""
    features = x.shape[1]
    if width is None:
        width = features
    elif isinstance(width, bool) or not isinstance(width, (int, numbers.Integral)) or not 0 <= width <= features:
        raise ValueError(f"{name}: width must be an int from 0 to {features} (x's columns), got {width!r}")
    else:
        width = int(width)
    return _as_aux(bias, "bias", width, aux_dtype_for(x.dtype), x.device), width


def _restricted_adjoint(adj: TiledAdjacency, row_scale, col_scale, diag, width: int):
    """For a product run elsewhere (cuSPARSE), the backward product that :func:`input_grads` would
    run with the zero-row skipping: ``(g, full) -> diag(c) (A^T + diag(d)) diag(r) g`` over the
    non-zero rows of ``g`` where the skipping applies to it, else ``full()`` (the caller's own full
    product); ``None`` itself for a product too small for the skipping ever to apply (checked
    arguments, ``width`` columns)."""
    if not grad_rows.may_apply(adj.nnz, width, adj.device.type):
        return None

    def product(g: torch.Tensor, full) -> torch.Tensor:
        return _adjoint_over_live_rows(*_adjacency_args(adj, g.dtype, True)[5:9], g, col_scale, row_scale, diag, full)

    return product


def _adjoint_over_live_rows(t_rowptr, t_col, t_values, t_plan, g, out_scale, row_scale, diag, full):
    """``diag(out_scale) (A^T + diag(d)) diag(r) g`` over the non-zero rows of ``g`` alone where
    the zero-row skipping applies (fgplugin.grad_rows decides), else ``full()``, the full product.

    In a CUDA graph capture the restriction is the one the eager steps before it found (a
    captured step's warm-up), and a replay whose ``g`` has a non-zero row outside it overwrites
    the result with the full product (the ``spmm_if`` op, which reads its flag on the device).
    An eager product whose width has settled on a restriction uses it the same way, without a
    host sync (fgplugin.grad_rows.settled_restriction)."""
    block_adaptive = t_plan is not None
    capturing = capture_holds.capturing(g)
    guarded = grad_rows.captured_restriction if capturing else grad_rows.settled_restriction
    found = guarded(t_rowptr, t_col, t_values, g, block_adaptive)
    if found is not None:
        rowptr, col, values, plan, outside = found
        out = csr_product(rowptr, col, values, g, out_scale, row_scale, diag, plan)
        torch.ops.fgplugin.spmm_if.default(outside, t_rowptr, t_col, t_values, g, out_scale, row_scale, diag, out)
        return out
    if capturing:  # the host check below would sync
        return full()
    restricted = grad_rows.restrict_to_live_rows(t_rowptr, t_col, t_values, g, block_adaptive)
    if restricted is None:
        return full()
    return csr_product(*restricted[:3], g, out_scale, row_scale, diag, restricted[3])


def spmm_adjoint(adj: TiledAdjacency, g: torch.Tensor, row_scale=None, col_scale=None, diag=None) -> torch.Tensor:
    r"""The adjoint product :math:`\mathrm{diag}(c)\,(A^T + \mathrm{diag}(d))\,\mathrm{diag}(r)\,G`.

    This is the gradient of ``spmm(adj, x, row_scale, col_scale, diag)`` with respect to ``x`` for
    an output gradient ``g`` (``[num_dst, F]``), computed without the forward product (the
    kernel plan of ``A^T``, kept on ``adj``). Arguments as for :func:`spmm`; returns
    ``[num_src, F]``. Differentiable like :func:`spmm`.
    """
    args, features = op_args(adj, g, row_scale, col_scale, diag, True, "fgplugin.spmm_adjoint", adjoint=True)
    return _cut(input_grads(args, args.x, (False, True, False, False, False))[1], features)


def spmm_vjp(adj: TiledAdjacency, x: torch.Tensor, grad: torch.Tensor, row_scale=None, col_scale=None, diag=None):
    """Gradients of ``spmm(adj, x, row_scale, col_scale, diag)`` for the output gradient ``grad``,
    without autograd (for code that runs where autograd is off, e.g. inside a custom op):
    ``(grad_values, grad_x, grad_row_scale, grad_col_scale, grad_diag)``, ``None`` for inputs that
    are ``None``. ``grad_values`` is in ``adj``'s CSR order (that of ``adj.values``); scales and
    ``diag`` must be tensors."""
    args, features = op_args(adj, x, row_scale, col_scale, diag, True, "fgplugin.spmm_vjp")
    if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != (adj.shape[0], features):
        raise ValueError(f"fgplugin.spmm_vjp: grad must be the output's gradient, of shape {(adj.shape[0], features)}, "
                         f"got {tuple(getattr(grad, 'shape', ()))}")
    if not grad.is_floating_point():
        raise ValueError(f"fgplugin.spmm_vjp: grad must be floating point (the output's gradient), got {grad.dtype}")
    grad = grad.to(args.x.dtype)  # the product's own precision, as the output has
    grad = _pad(grad, args.x.shape[1] - features)
    need = (args.values is not None, True, row_scale is not None, col_scale is not None, diag is not None)
    grad_values, grad_x, grad_r, grad_c, grad_d = input_grads(args, grad, need)
    return grad_values, _cut(grad_x, features), grad_r, grad_c, grad_d


def spmm_skipping_zero_rows(adj: TiledAdjacency, x: torch.Tensor, row_scale=None, col_scale=None, diag=None, *,
                            live: torch.Tensor | None = None) -> torch.Tensor:
    """``spmm(adj, x, ...)`` for a backward pass (no autograd), leaving out the columns of ``A``
    whose row of ``x`` is zero (:mod:`fgplugin.grad_rows`): with ``live=None`` where that pays by
    the rules of the zero-row skipping, given the bool mask ``live`` of ``x``'s non-zero rows
    always. The distributed backward multiplies its blocks with the gradient this way."""
    args, features = op_args(adj, x, row_scale, col_scale, diag, False, "fgplugin.spmm")
    block_adaptive = args.plan is not None
    if live is None:
        restricted = grad_rows.restrict_to_live_rows(args.rowptr, args.col, args.values, args.x, block_adaptive)
    else:
        restricted = grad_rows.restricted(args.rowptr, args.col, args.values, live, block_adaptive)
    if restricted is None:
        return _cut(args.call(), features)
    return _cut(csr_product(*restricted[:3], args.x, args.row_scale, args.col_scale, args.diag, restricted[3]),
                features)


def csr_product(rowptr, col, values, x, row_scale, col_scale, diag, plan=None, bias=None,
                width: int = -1) -> torch.Tensor:
    """The op on a bare CSR without its transpose: a product nothing will differentiate (the
    restricted products of the zero-row skipping). Scales, ``diag`` and ``bias`` in ``x``'s aux
    dtype; ``plan`` a :class:`fgplugin.kernel_plan.KernelPlan` of the CSR or ``None``; ``width``
    as the op's (-1: all columns)."""
    return run_spmm(OpArgs(rowptr, col, values, x, row_scale, col_scale, diag, *_plan_args(plan), None, None, None,
                           None, (), bias, width))


# ---------------------------------------------------------------------- argument preparation
def op_args(adj, x, row_scale, col_scale, diag, with_transpose: bool, name: str,
            adjoint: bool = False) -> tuple[OpArgs, int]:
    """The op's arguments for ``spmm(adj, x, ...)`` (checked, scales in the aux dtype, ``x``
    padded to whole 16-byte rows on CUDA) and ``x``'s feature count. With ``adjoint``, ``x`` is
    an output gradient (one row per destination node, in the op's ``x`` slot, which the adjoint
    product reads as its input) and the transpose is always included."""
    row_scale, col_scale, diag = checked_inputs(adj, x, row_scale, col_scale, diag, name, adjoint)
    return _op_args_of_checked(adj, x, row_scale, col_scale, diag, with_transpose or adjoint)


def checked_inputs(adj, x, row_scale, col_scale, diag, name: str, adjoint: bool = False) -> tuple:
    """``(row_scale, col_scale, diag)`` of ``spmm(adj, x, ...)`` checked and in ``x``'s aux dtype
    (a float ``diag`` as a vector); raises a ValueError or TypeError naming the problem."""
    if not isinstance(adj, TiledAdjacency):
        raise TypeError(f"{name} expects a TiledAdjacency, got {type(adj).__name__}; build one with "
                        "TiledAdjacency.from_edge_index(edge_index, num_nodes)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"{name}: x must be a 2-D floating-point tensor [num_nodes, F], got "
                         f"{getattr(x, 'dtype', type(x).__name__)} of shape {list(getattr(x, 'shape', []))}")
    if x.layout != torch.strided:
        raise ValueError(f"{name}: x must be a dense tensor, got layout {x.layout}; pass x.to_dense() (the PyG "
                         "and DGL layers take sparse features themselves)")
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
    if isinstance(diag, (int, float)):
        diag = _diag_vector(adj, diag, aux)
    return (_as_aux(row_scale, "row_scale", n_rows, aux, x.device),
            _as_aux(col_scale, "col_scale", n_cols, aux, x.device),
            _as_aux(diag, "diag", min(n_rows, n_cols), aux, x.device))


def _diag_vector(adj, diag: float, aux: torch.dtype) -> torch.Tensor | None:
    """A float self-loop weight as the op takes it: a (kept) vector, or ``None`` for 0."""
    return None if diag == 0 else adj.constant_diag(float(diag), aux)


def _op_args_of_checked(adj, x, row_scale, col_scale, diag, transpose: bool) -> tuple[OpArgs, int]:
    features = x.shape[1]
    if x.is_cuda:
        x = _pad(x, padded_width(features, x.dtype, x.device, adj.nnz) - features)
    rowptr, col, values, *plan, t_rowptr, t_col, t_values, t_plan, t_layout = _adjacency_args(adj, x.dtype, transpose)
    args = OpArgs(rowptr, col, values, x, row_scale, col_scale, diag, *plan, t_rowptr, t_col, t_values, t_plan,
                  t_layout)
    return args, features


def _adjacency_args(adj: TiledAdjacency, dtype: torch.dtype, transpose: bool) -> tuple:
    """The op's arguments that come from ``adj`` for features of ``dtype``: ``(rowptr, col,
    values, plan, plan_layout, t_rowptr, t_col, t_values, t_plan, t_plan_layout)``, the ``t_``
    ones ``None`` without ``transpose``. Kept on ``adj`` (per dtype, with or without the transpose,
    block-adaptive kernel on or off), so a call after the first looks them up instead of casting
    the edge values and finding the plans again; rebuilt after an in-place write to the edge
    values; not kept when they need a gradient (their cast belongs to each step's autograd graph)
    or under torch.compile (traced as code)."""
    compiling = torch.compiler.is_compiling()
    key = ("op_args", dtype, transpose, settings.block_adaptive)
    kept = None if compiling else adj._kept_for_values(key)
    if kept is not None:
        return kept
    values = None if adj.values is None else adj.values.to(aux_dtype_for(dtype))
    t_rowptr = t_col = t_values = t_plan = None
    if transpose:
        t_rowptr, t_col, _ = adj.transpose()
        t_values = None if values is None else adj.transposed_values(values)
        t_plan = adj.kernel_plan(dtype, transpose=True)
    parts = (adj.rowptr, adj.col, values, *_plan_args(adj.kernel_plan(dtype)), t_rowptr, t_col, t_values,
             *_plan_args(t_plan))
    adj._keep_for_values(key, parts)  # not while the values need grad, nor under torch.compile
    return parts


def _plan_args(plan) -> tuple:
    return (None, ()) if plan is None else (plan.buffer, plan.layout)


def _as_aux(t, name, length, aux, device):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"fgplugin.spmm: {name} must be a 1-D tensor of length {length}, got "
                         f"{getattr(t, 'shape', type(t).__name__)}")
    if t.device != device:
        raise ValueError(f"fgplugin.spmm: {name} is on {t.device} but x is on {device}")
    if t.dtype.is_complex:  # the cast below would drop its imaginary part
        raise ValueError(f"fgplugin.spmm: {name} is {t.dtype}; fgplugin computes with real numbers: pass a real "
                         f"{name}")
    return t if t.dtype == aux else t.to(aux)


PAD_MIN_WORK = 1 << 26  # multiply-adds (nnz x width) below which a CUDA product is not padded


def padded_width(features: int, dtype: torch.dtype, device: torch.device, nnz: int | None = None) -> int:
    """The width to which :func:`spmm` pads ``features`` columns of ``dtype`` on ``device``
    (whole 16-byte rows on CUDA; ``features`` itself elsewhere, and for a product of ``nnz``
    non-zeros with under ``PAD_MIN_WORK`` multiply-adds).

    Why: the CUDA kernels gather a neighbour's row with 16-byte loads only when F is a multiple
    of 4 (fp32) or 8 (16-bit); otherwise every element is a 4-byte load. On reddit-like (H200)
    the F=41 SpMMs of a GCN's output layer took about as long as the F=128 ones. Padding costs
    two n x F copies; a layer that computes ``spmm(adj, x @ W)`` avoids them by padding ``W``
    instead (fgplugin.aggregation). A small product gains a few microseconds of kernel time from
    it, while an eager step pays the padding's ops and autograd function on the host (H100
    machine: a GCN layer's forward took 197 us at 7 columns padded to 8 against 167 us at 16;
    unpadded, 125 against 122 us; docs/results.md section 17)."""
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    if device_type != "cuda" or dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return features
    if nnz is not None and nnz * features < PAD_MIN_WORK:
        return features
    per_vector = 16 // dtype.itemsize
    return features + -features % per_vector


def padded_columns(grad: torch.Tensor, width: int) -> torch.Tensor:
    """``grad`` with zero columns appended up to ``width``: the gradient of a product cut to fewer
    columns. Written once by the ``pad_columns`` op (on CUDA a kernel of its own: torch's ``cat``
    of products-like's [2.45M, 47] gradient with a zero column took 0.77 ms of a 13 ms training
    step on an H100, over twice a plain copy of the same bytes); by torch's ``pad`` where the
    result must be differentiable (a double backward) or under functorch (the op has no rules)."""
    pad = width - grad.shape[-1]
    if pad == 0:
        return grad
    if grad.dim() == 2 and not torch.is_grad_enabled() and not torch._C._are_functorch_transforms_active():
        return torch.ops.fgplugin.pad_columns(grad.contiguous(), width)
    return torch.nn.functional.pad(grad, (0, pad))


def _pad(x: torch.Tensor, pad: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, pad)) if pad else x


def _cut(out: torch.Tensor, features: int) -> torch.Tensor:
    return out[:, :features].contiguous() if out.shape[1] != features else out
