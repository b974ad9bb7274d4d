"""Loader for real graphs stored as ``.npz`` files.

Bare names (``load_npz("cora")``) are looked up in the folder given as ``root=`` or, without one,
in ``$FGPLUGIN_DATA_DIR`` (:func:`data_dir`); a path to a file works anywhere. Nothing else is
searched: with neither set, a bare name raises ``FileNotFoundError`` saying what to set.

File schema (one graph per file; every array is numeric, bool or unicode, so ``np.load`` needs no
``allow_pickle``):

- ``edge_index``: int64 ``[2, E]``, always. Row 0 = source, row 1 = target, sorted by (source,
  target), no duplicate pairs, no self loops. Undirected graphs store both directions, so ``E``
  counts directed entries (twice the undirected edges).
- ``num_nodes``: int64 0-d, always: ``N``. Isolated nodes exist, so use it rather than
  ``edge_index.max() + 1``.
- ``undirected``: bool 0-d, always: True when ``edge_index`` is symmetric.
- ``x``: float32 ``[N, F]``, dense node features; or, instead of ``x``, CSR features
  ``x_indptr`` (int64 ``[N + 1]``), ``x_indices`` (int64 ``[nnz]``), ``x_data`` (float32
  ``[nnz]``) and ``x_shape`` (int64 ``[2]`` = ``(N, F)``), as in
  ``scipy.sparse.csr_matrix((x_data, x_indices, x_indptr), shape=tuple(x_shape))``; neither for
  structure-only graphs.
- ``y``: int64 ``[N]`` when labelled: class index ``0 .. C-1``, ``-1`` = unlabelled (leave those
  nodes out of the loss and the metrics).
- ``train_mask``, ``val_mask``, ``test_mask``: bool ``[N]``, where the source has a fixed split;
  disjoint, labelled nodes only.
- ``source``: unicode strings ``[k]``, always: provenance lines (name, origin, licence,
  preprocessing notes).

:func:`load_npz` checks the keys and shapes above and names the file and this schema when one is
off.
"""
from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from .. import config
from .graph import GraphData

ENV_VAR = "FGPLUGIN_DATA_DIR"
_CSR_KEYS = ("x_indptr", "x_indices", "x_data", "x_shape")
_MASK_KEYS = ("train_mask", "val_mask", "test_mask")
_FEATURE_MODES = ("auto", "dense", "sparse", None)
SCHEMA = "the .npz schema in the docstring of fgplugin.datasets.npz"


def data_dir() -> Path | None:
    """``Path($FGPLUGIN_DATA_DIR)``, the folder of the ``.npz`` graphs that bare names refer to,
    or ``None`` when the variable is unset or empty.

    Returned as given, even if it does not exist, so that a wrong setting shows up as an error
    naming it instead of silently finding nothing.
    """
    return config.data_dir()  # fgplugin.config reads every environment setting


def list_npz(root: str | os.PathLike | None = None) -> list[str]:
    """Sorted names (file stems, e.g. ``"cora"``) of the ``.npz`` graphs in ``root`` or
    :func:`data_dir`; empty when there is no such folder."""
    folder = Path(root).expanduser() if root is not None else data_dir()
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.npz"))


def load_npz(
    name_or_path: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    features: str | None = "auto",
) -> GraphData:
    """Load one ``.npz`` graph (schema: the module docstring) as :class:`GraphData` (CPU tensors).

    Args:
        name_or_path: a path to an ``.npz`` file, or a bare name such as ``"cora"`` looked up in
            ``root`` (default: :func:`data_dir`, i.e. ``$FGPLUGIN_DATA_DIR``).
        root: folder for bare names.
        features: ``"dense"`` (float32 [N, F]; CSR files are densified), ``"sparse"`` (CSR files
            as ``torch.sparse_csr`` float32, dense files stay dense), ``"auto"`` (as stored) or
            ``None`` (no features loaded).

    Raises:
        FileNotFoundError: no such file; or a bare name with neither ``root`` nor
            ``$FGPLUGIN_DATA_DIR`` set.
        ValueError: the file is not a readable archive or does not follow the schema.

    Returns:
        GraphData with ``num_classes = y.max() + 1`` when the file has labels and
        ``meta["source"]`` = the file's provenance lines.
    """
    if features not in _FEATURE_MODES:
        raise ValueError(f"features must be one of {_FEATURE_MODES}, got {features!r}.")
    path = _resolve(name_or_path, root)
    arrays = _read(path)
    _validate(path, arrays)

    y = arrays.get("y")
    masks = {k: torch.from_numpy(arrays[k]) for k in _MASK_KEYS if k in arrays}
    try:
        x = _features(arrays, features)
    except RuntimeError as err:  # torch's own checks of the CSR features (column ids, order)
        raise ValueError(f"{path}: the CSR features fail torch's checks ({err}); expected {SCHEMA}.") from err
    return GraphData(
        name=path.stem,
        edge_index=torch.from_numpy(arrays["edge_index"]),
        num_nodes=int(arrays["num_nodes"]),
        x=x,
        y=None if y is None else torch.from_numpy(y),
        num_classes=None if y is None or not y.size else int(y.max()) + 1,
        meta={
            "source": [str(line) for line in arrays["source"]],
            "path": str(path),
            "undirected": bool(arrays["undirected"]),
        },
        **masks,
    )


def _resolve(name_or_path: str | os.PathLike, root) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if isinstance(name_or_path, os.PathLike) or len(path.parts) > 1:
        raise FileNotFoundError(f"no such graph file: {path}.")
    folder = Path(root).expanduser() if root is not None else data_dir()
    if folder is None:
        raise FileNotFoundError(
            f"cannot find graph {str(name_or_path)!r}: no data folder; set {ENV_VAR} to the folder "
            f"holding the .npz files or pass root= / a path to the file."
        )
    candidate = folder / (path.name if path.suffix == ".npz" else f"{path.name}.npz")
    if not candidate.is_file():
        available = ", ".join(list_npz(folder)) or "none"
        hint = "pass root=" if root is not None else f"set {ENV_VAR}"
        raise FileNotFoundError(
            f"no graph {str(name_or_path)!r} in {folder} (looked for {candidate.name}); "
            f"available: {available}. Check the name, or {hint} to point at another folder."
        )
    return candidate


def _read(path: Path) -> dict[str, np.ndarray]:
    def fail(why: str):
        return ValueError(
            f"{path} is not a readable .npz archive ({why}); expected {SCHEMA}."
        )

    try:
        data = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise fail(f"{type(err).__name__}: {err}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise fail("it holds a single .npy array")
    with data:
        try:
            return {key: data[key] for key in data.files}
        except (zipfile.BadZipFile, ValueError, OSError) as err:
            raise fail(f"{type(err).__name__}: {err}") from err


def _validate(path: Path, arrays: dict) -> None:
    """Check the keys and shapes the schema promises, naming the file on failure."""
    def fail(what: str):
        raise ValueError(f"{path}: {what}; expected {SCHEMA}.")

    missing = [k for k in ("edge_index", "num_nodes", "undirected", "source") if k not in arrays]
    if missing:
        fail(f"missing key(s) {missing}")
    present_csr = [k for k in _CSR_KEYS if k in arrays]
    if present_csr and len(present_csr) != len(_CSR_KEYS):
        fail(f"partial CSR features: has {present_csr}, needs all of {list(_CSR_KEYS)}")
    ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype != np.int64:
        fail(f"edge_index must be int64 [2, E], got {ei.dtype} {list(ei.shape)}")
    num_nodes, undirected = arrays["num_nodes"], arrays["undirected"]
    if num_nodes.ndim != 0 or num_nodes.dtype.kind not in "iu" or int(num_nodes) < 0:
        fail(f"num_nodes must be a non-negative int64 0-d array, got {num_nodes.dtype} {list(num_nodes.shape)}")
    if undirected.ndim != 0 or undirected.dtype != np.bool_:
        fail(f"undirected must be a bool 0-d array, got {undirected.dtype} {list(undirected.shape)}")
    n = int(num_nodes)
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        fail(f"edge_index has ids outside [0, num_nodes={n})")
    if "x" in arrays and (arrays["x"].ndim != 2 or arrays["x"].dtype.kind != "f"):
        fail(f"x must be float [N, F], got {arrays['x'].dtype} {list(arrays['x'].shape)}")
    for key, array in arrays.items():
        if array.dtype.kind in "iuf" and array.dtype.byteorder not in "=|":  # torch reads native order only
            fail(f"{key} is stored big-endian ({array.dtype}); save it in native byte order "
                 f"(array.astype(array.dtype.newbyteorder('=')))")
    y = arrays.get("y")
    if y is not None:
        labels = f"y must be int64 [N] of class indices (-1 = unlabelled), got {y.dtype} {list(y.shape)}"
        if y.ndim != 1 or y.dtype.kind not in "iu":
            fail(labels)
        if y.size and y.min() < -1:
            fail(f"{labels} with values down to {int(y.min())}")
    for key in _MASK_KEYS:  # a 0/1 integer mask would index rows 0 and 1, not select nodes
        if key in arrays and (arrays[key].ndim != 1 or arrays[key].dtype != np.bool_):
            fail(f"{key} must be bool [N], got {arrays[key].dtype} {list(arrays[key].shape)}")
    for key in ("x", "y", *_MASK_KEYS):
        if key in arrays and arrays[key].shape[0] != n:
            fail(f"{key} has {arrays[key].shape[0]} rows, num_nodes is {n}")
    if present_csr:
        indptr, indices, data, shape = (arrays[k] for k in _CSR_KEYS)
        if shape.shape != (2,) or shape.dtype.kind not in "iu":
            fail(f"x_shape must be int64 [2] = (N, F), got {shape.dtype} {list(shape.shape)}")
        if int(shape[0]) != n:
            fail(f"x_shape[0]={int(shape[0])}, num_nodes is {n}")
        if indptr.dtype != np.int64 or indices.dtype != np.int64 or data.dtype.kind != "f":
            fail(f"CSR features must be int64 x_indptr and x_indices and float x_data, got {indptr.dtype}, "
                 f"{indices.dtype}, {data.dtype}")
        if indptr.shape != (n + 1,) or indices.ndim != 1 or data.shape != indices.shape \
                or (n and int(indptr[-1]) != indices.size):
            fail(f"CSR features of inconsistent lengths: x_indptr {list(indptr.shape)} (needs [{n + 1}]), "
                 f"x_indices {list(indices.shape)}, x_data {list(data.shape)}")


def _features(arrays: dict, mode: str | None) -> torch.Tensor | None:
    if mode is None:
        return None
    if "x" in arrays:
        return torch.from_numpy(arrays["x"]).float()
    if "x_indptr" not in arrays:
        return None
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR is "beta"; it is the intended format here.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        x = torch.sparse_csr_tensor(
            torch.from_numpy(arrays["x_indptr"]),
            torch.from_numpy(arrays["x_indices"]),
            torch.from_numpy(arrays["x_data"]).float(),
            size=tuple(int(s) for s in arrays["x_shape"]),
            check_invariants=True,  # O(nnz), and catches a corrupt file before any kernel reads it
        )
    return x.to_dense() if mode == "dense" else x
