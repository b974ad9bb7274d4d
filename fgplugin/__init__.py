"""fgplugin: block-adaptive SpMM for full-batch GNN training with PyG and DGL.

Importing fgplugin builds (first time) and loads its kernels; see fgplugin/_extension.py.
"""
import torch as _torch

from . import _extension, config, ops as _ops, parallel_dropout
from .config import set_cusparse, set_input_cache, set_row_skipping, set_sparse_input
from .graphed import graphed_step
from .normalization import Normalization, normalization
from .ops import spmm
from .parallel_dropout import Dropout, dropout
from .tiling import TiledAdjacency, TileStats

__version__ = "0.1.0"

_status = _extension.load()
if not _status.loaded:
    _ops.define_reference_ops()
elif not _status.cuda:
    _ops.define_reference_ops(cuda_only=True)
_ops.register_python_parts()
parallel_dropout.register_python_parts()
_torch.ops.fgplugin.set_wgmma(config.settings.wgmma)

# PyG datasets save pre_transform output and read it back with torch.load(weights_only=True).
_torch.serialization.add_safe_globals([TiledAdjacency])


def extension_status() -> "_extension.ExtensionStatus":
    """Whether the compiled kernels (and the CUDA ones) are in use, and if not, why."""
    return _status


__all__ = ["TiledAdjacency", "TileStats", "Normalization", "normalization", "spmm", "extension_status",
           "set_input_cache", "set_row_skipping", "set_sparse_input", "set_cusparse", "dropout", "Dropout", "graphed_step"]
