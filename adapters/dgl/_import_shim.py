"""Importing DGL 2.1 (PyPI's newest Linux release, CPU-only) under a newer torch.

DGL 2.1.0's ``dgl/__init__.py`` imports its GraphBolt subpackage, which loads a C++ library built
for one torch version (``dgl/graphbolt/libgraphbolt_pytorch_<version>.so``, torch <= 2.2 only) and
imports ``torchdata.datapipes`` (gone since torchdata 0.10). Under a newer torch that import
fails, although DGL's core (graphs, message passing, ``dgl.nn``) never uses GraphBolt. When
GraphBolt cannot load, :func:`import_dgl` registers an empty module as ``dgl.graphbolt`` before
importing DGL, so the rest of DGL imports and works (tests/test_dgl_layers.py runs GraphConv
forward and backward through it); only GraphBolt's samplers are missing.

DGL 2.1.0 also reads ``packaging`` (falling back to ``setuptools.extern.packaging``, which newer
setuptools no longer ship) and ``dgl.data`` imports pandas without declaring it; the ``dgl`` extra
of fgplugin installs both, so nothing needs shimming there.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch

_INSTALL_HINT = "install it with `pip install fgplugin[dgl]` (DGL 2.1 with packaging and pandas)"


def import_dgl():
    """``import dgl``, with an empty ``dgl.graphbolt`` stand-in where GraphBolt cannot load.

    Raises:
        ImportError: DGL is missing or fails to import; the message says how to install it.
    """
    if "dgl" in sys.modules:
        return sys.modules["dgl"]
    spec = importlib.util.find_spec("dgl")
    if spec is None:
        raise ImportError(f"fgplugin.dgl needs DGL; {_INSTALL_HINT}")
    if graphbolt_needs_shim(Path(spec.submodule_search_locations[0])):
        sys.modules["dgl.graphbolt"] = types.ModuleType("dgl.graphbolt", "empty stand-in set by fgplugin.dgl")
    try:
        return importlib.import_module("dgl")
    except ImportError as err:
        raise ImportError(f"DGL is installed but failed to import ({err}); {_INSTALL_HINT}") from err


def graphbolt_needs_shim(dgl_dir: Path) -> bool:
    """Whether the DGL in ``dgl_dir`` has a GraphBolt that cannot load under this torch."""
    graphbolt = dgl_dir / "graphbolt"
    if not graphbolt.is_dir():
        return False
    version = torch.__version__.split("+")[0]
    has_library = any(graphbolt.glob(f"*graphbolt_pytorch_{version}.*"))
    has_datapipes = importlib.util.find_spec("torchdata") is not None \
        and importlib.util.find_spec("torchdata.datapipes") is not None
    return not (has_library and has_datapipes)
