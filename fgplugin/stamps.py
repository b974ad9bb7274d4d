"""What tells a tensor's contents apart over time, for the caches that key a tensor object."""
from __future__ import annotations

import torch


def stamp(t: torch.Tensor) -> tuple:
    """``t``'s version counter (in-place writes through torch), where its data lives and its shape
    (an assignment to ``t.data``, which leaves the counter as it was). Writes that torch does not
    count are not seen: in place through ``t.data`` or through a NumPy view."""
    return t._version, t.data_ptr() if t.layout == torch.strided else None, t.shape
