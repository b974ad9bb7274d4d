"""Loader for the shared real-graph ``.npz`` files (schema: ../shared/data/README.md)."""
from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from .graph import GraphData

ENV_VAR = "FGPLUGIN_DATA_DIR"
_CSR_KEYS = ("x_indptr", "x_indices", "x_data", "x_shape")
_MASK_KEYS = ("train_mask", "val_mask", "test_mask")
_FEATURE_MODES = ("auto", "dense", "sparse", None)


def shared_data_dir() -> Path | None:
    """The folder of the shared ``.npz`` graphs, or ``None`` when it cannot be found.

    ``$FGPLUGIN_DATA_DIR`` wins when set (returned as given, even if wrong, so a bad setting shows
    up as an error instead of silently falling back). Otherwise walk up from the working directory
    and from this file, trying ``<dir>/../shared/data`` and ``<dir>/shared/data``; the first one
    holding a ``README.md`` and ``*.npz`` files is it.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            for candidate in (d.parent / "shared" / "data", d / "shared" / "data"):
                if _is_data_dir(candidate):
                    return candidate
    return None


def list_npz(root: str | os.PathLike | None = None) -> list[str]:
    """Sorted names (file stems, e.g. ``"cora"``) of the ``.npz`` graphs in ``root`` or
    :func:`shared_data_dir`; empty when there is no such folder."""
    folder = Path(root) if root is not None else shared_data_dir()
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.npz"))


def require_shared_data() -> Path:
    """For tests needing the real graphs: the data folder, else skip (locally) or fail (CI).

    In CI (``$CI`` is ``true``) a missing ``../shared/data`` is a broken checkout, so the test
    fails instead of silently skipping.
    """
    import pytest

    folder = shared_data_dir()
    if folder is not None and _is_data_dir(folder):
        return folder
    where = f"{ENV_VAR}={folder}" if folder is not None else "../shared/data"
    msg = (
        f"real graph data not found ({where} is missing or holds no README.md and *.npz); "
        f"check out ../shared/data beside the repository or set {ENV_VAR}"
    )
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(msg)
    pytest.skip(msg)


def load_npz(
    name_or_path: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    features: str | None = "auto",
) -> GraphData:
    """Load one shared ``.npz`` graph as :class:`GraphData` (CPU tensors).

    Args:
        name_or_path: a path to an ``.npz`` file, or a bare name such as ``"cora"`` looked up in
            ``root`` (default: :func:`shared_data_dir`).
        root: folder for bare names.
        features: ``"dense"`` (float32 [N, F]; CSR files are densified), ``"sparse"`` (CSR files
            as ``torch.sparse_csr`` float32, dense files stay dense), ``"auto"`` (as stored) or
            ``None`` (no features loaded).

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
    return GraphData(
        name=path.stem,
        edge_index=torch.from_numpy(arrays["edge_index"]),
        num_nodes=int(arrays["num_nodes"]),
        x=_features(arrays, features),
        y=None if y is None else torch.from_numpy(y),
        num_classes=None if y is None else int(y.max()) + 1,
        meta={
            "source": [str(line) for line in arrays["source"]],
            "path": str(path),
            "undirected": bool(arrays["undirected"]),
        },
        **masks,
    )


def _is_data_dir(folder: Path) -> bool:
    return (folder / "README.md").is_file() and any(folder.glob("*.npz"))


def _resolve(name_or_path: str | os.PathLike, root) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if isinstance(name_or_path, os.PathLike) or len(path.parts) > 1:
        raise FileNotFoundError(f"no such graph file: {path}.")
    folder = Path(root).expanduser() if root is not None else shared_data_dir()
    if folder is None:
        raise FileNotFoundError(
            f"cannot find graph {str(name_or_path)!r}: no data folder given and ../shared/data "
            f"was not found; set {ENV_VAR} to the folder holding the .npz files or pass root=."
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
            f"{path} is not a readable .npz archive ({why}); re-copy it from ../shared/data."
        )

    try:
        data = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise fail(f"{type(err).__name__}: {err}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise fail("it holds a single .npy array")
    with data:
        try:
            return {key: data[key] for key in data.files}
        except (zipfile.BadZipFile, ValueError, OSError) as err:
            raise fail(f"{type(err).__name__}: {err}") from err


def _validate(path: Path, arrays: dict) -> None:
    """Check the keys and shapes the README schema promises, naming the file on failure."""
    def fail(what: str):
        raise ValueError(f"{path}: {what}; expected the schema of ../shared/data/README.md.")

    missing = [k for k in ("edge_index", "num_nodes", "undirected", "source") if k not in arrays]
    if missing:
        fail(f"missing key(s) {missing}")
    present_csr = [k for k in _CSR_KEYS if k in arrays]
    if present_csr and len(present_csr) != len(_CSR_KEYS):
        fail(f"partial CSR features: has {present_csr}, needs all of {list(_CSR_KEYS)}")
    ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.dtype != np.int64:
        fail(f"edge_index must be int64 [2, E], got {ei.dtype} {list(ei.shape)}")
    n = int(arrays["num_nodes"])
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        fail(f"edge_index has ids outside [0, num_nodes={n})")
    for key in ("x", "y", *_MASK_KEYS):
        if key in arrays and arrays[key].shape[0] != n:
            fail(f"{key} has {arrays[key].shape[0]} rows, num_nodes is {n}")
    if present_csr and int(arrays["x_shape"][0]) != n:
        fail(f"x_shape[0]={int(arrays['x_shape'][0])}, num_nodes is {n}")


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
