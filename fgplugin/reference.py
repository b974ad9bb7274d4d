"""Pure-torch reference kernels of fgplugin's ops.

They define what the compiled kernels compute, run whenever the extension could not be built
(see fgplugin/_extension.py), and are checked in the tests against a dense float64 product.
They use scatter-adds (atomics on GPUs), so unlike the compiled kernels they are neither fast nor
bitwise deterministic on CUDA.
"""
from __future__ import annotations

import torch

from ._csr import aux_dtype_for, rows_of_edges


def spmm_reference(rowptr, col, values, x, row_scale, col_scale, diag, plan=None, plan_layout=(), t_rowptr=None,
                   t_col=None, t_values=None, t_plan=None, t_plan_layout=(), bias=None, width=-1):
    """out = diag(row_scale) . (A + diag(diag)) . diag(col_scale) . x, accumulated in the aux dtype
    (values and scales are rounded to it, as fgplugin.spmm does); its first ``width`` columns
    (all for -1), plus ``bias`` added in x's dtype, as the compiled kernels without a fused
    epilogue do."""
    acc = aux_dtype_for(x.dtype)
    n_rows = rowptr.numel() - 1
    out_width = x.shape[1] if width < 0 else width
    # the lengths the compiled op checks (csrc/args.cpp): a repeated call passes its tensors
    # unchecked, and a wrong length would broadcast here instead of failing
    for t, name, length in ((row_scale, "row_scale", n_rows), (col_scale, "col_scale", x.shape[0]),
                            (diag, "diag", min(n_rows, x.shape[0])), (bias, "bias", out_width)):
        if t is not None and (t.dim() != 1 or t.numel() != length):
            raise RuntimeError(f"fgplugin.spmm: {name} must be a 1-D tensor with {length} entries, got shape "
                               f"{list(t.shape)}")
    values, row_scale, col_scale, diag = (None if t is None else t.to(acc) for t in (values, row_scale, col_scale, diag))
    xs = x.to(acc)
    if col_scale is not None:
        xs = xs * col_scale.unsqueeze(1)
    messages = xs.index_select(0, col.long())
    if values is not None:
        messages = messages * values.unsqueeze(1)
    out = torch.zeros(n_rows, x.shape[1], dtype=acc, device=x.device)
    out.index_add_(0, rows_of_edges(rowptr, col.numel()), messages)
    if diag is not None:
        n_diag = diag.numel()
        out[:n_diag] += diag.unsqueeze(1) * xs[:n_diag]
    if row_scale is not None:
        out = out * row_scale.unsqueeze(1)
    out = out.to(x.dtype)
    if 0 <= width < out.shape[1]:
        out = out[:, :width].contiguous()
    return out if bias is None else out.add_(bias)


def spmm_if_reference(flag, rowptr, col, values, x, row_scale, col_scale, diag, out):
    """When the one-element bool ``flag`` holds true, ``out`` = the spmm product (see
    :func:`spmm_reference`); else ``out`` stays as it is."""
    # torch.where, not an `if`: reading the flag on the host would sync, which a CUDA graph capture
    # (the op's use) must not meet
    out.copy_(torch.where(flag, spmm_reference(rowptr, col, values, x, row_scale, col_scale, diag), out))


def sddmm_reference(rowptr, col, a, b):
    """out[e] = <a[row(e)], b[col(e)]> for every non-zero e, in the aux dtype."""
    acc = aux_dtype_for(a.dtype)
    rows = rows_of_edges(rowptr, col.numel())
    return (a.to(acc).index_select(0, rows) * b.to(acc).index_select(0, col.long())).sum(dim=1)


def nonzero_rows_reference(x):
    """Bool [n_rows]: rows of ``x`` with an entry that is not zero (NaN != 0 counts)."""
    if x.shape[1] == 0:
        return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    return x.abs().amax(dim=1) != 0


def pad_columns_reference(x, width):
    """``x`` with zero columns appended up to ``width``."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1])).contiguous()


def dropout_reference(x, p, seed):
    raise RuntimeError("fgplugin::dropout needs fgplugin's compiled kernels, which are not built here "
                       "(fgplugin.extension_status() says why); fgplugin.dropout uses torch's dropout instead")


def set_wgmma_reference(enabled):
    return bool(enabled)  # no CUDA kernels: nothing to switch


def dense_tile_arch_reference(device):
    raise RuntimeError("fgplugin::dense_tile_arch: fgplugin's CUDA kernels are not built here "
                       "(fgplugin.extension_status() says why)")
