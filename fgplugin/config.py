"""Every setting of fgplugin that comes from the environment, read here and nowhere else.

The switches are read once, at import, into :data:`settings` (``0`` / ``1``, or true/false,
on/off, yes/no; anything else is an error); change them at run time with the ``set_*`` functions
below (each returns the previous value). The data folder, the preprocessing cache's folder and
the collective timeout are read when they are used, so a script may set them after importing
fgplugin; the compiled kernels' folder (``FGPLUGIN_CACHE_DIR``) must be set before the import,
which builds and loads them. :func:`table` renders the list for the documentation (docs/design.md,
"Configuration").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str


VARIABLES = (
    Variable("FGPLUGIN_CACHE_DIR", "`$XDG_CACHE_HOME/fgplugin` or `~/.cache/fgplugin`",
             "where the compiled kernels and the on-disk preprocessing cache go"),
    Variable("FGPLUGIN_DATA_DIR", "unset",
             "folder of `.npz` graphs that `load_npz(name)` and `fgplugin bench --graphs <name>` read"),
    Variable("FGPLUGIN_NO_EXTENSION", "0", "`1`: do not build the C++/CUDA kernels; run the pure-torch reference ops"),
    Variable("FGPLUGIN_NO_CUDA", "0", "`1`: build the CPU kernels only"),
    Variable("FGPLUGIN_VERBOSE_BUILD", "0", "`1`: show the compiler's output while the kernels build"),
    Variable("FGPLUGIN_BLOCK_ADAPTIVE", "1", "`0`: run every CUDA product on the plain CSR kernel (no dense tiles)"),
    Variable("FGPLUGIN_NO_WGMMA", "0",
             "`1`: dense tiles on H100/H200 use the `mma.sync` kernel instead of the `wgmma` one "
             "(`fgplugin.config.set_wgmma`)"),
    Variable("FGPLUGIN_INPUT_CACHE", "1",
             "`0`: layers never keep the aggregation of a constant input (`fgplugin.set_input_cache`)"),
    Variable("FGPLUGIN_SPARSE_INPUT", "auto",
             "`0`: a layer's constant input is never kept as a sparse matrix; `1`: always where it applies; "
             "`auto`: where it is faster, timed by a probe, and in eager CUDA steps, where the probe leaves the "
             "sparse form a chance, on the first training steps (`fgplugin.set_sparse_input`)"),
    Variable("FGPLUGIN_CUSPARSE", "auto",
             "`0`: products always run on fgplugin's kernels; `1`: on `torch.sparse.mm` wherever that applies; "
             "`auto`: at the widths where a timed probe finds cuSPARSE faster (`fgplugin.set_cusparse`)"),
    Variable("FGPLUGIN_SKIP_ZERO_ROWS", "1",
             "`0`: backward products never skip the zero rows of their output gradient "
             "(`fgplugin.set_row_skipping`; a step captured before replays what it captured)"),
    Variable("FGPLUGIN_DIST_TIMEOUT", "300", "seconds before a collective of `fgplugin.distributed` gives up"),
    Variable("FGPLUGIN_COMMIT", "unset", "the source version `fgplugin bench` records as its results' `commit` "
             "when `--commit` is not given"),
)


MODES = ("auto", "0", "1")
_SPELLINGS = {"true": "1", "on": "1", "yes": "1", "false": "0", "off": "0", "no": "0"}


def mode_of(value) -> str | None:
    """``"auto"``, ``"0"`` or ``"1"`` for a three-way setting given as one of them, a bool or a
    common spelling of one (true/false, on/off, yes/no); ``None`` for anything else."""
    if isinstance(value, bool):
        return "1" if value else "0"
    mode = _SPELLINGS.get(str(value).strip().lower(), str(value).strip().lower())
    return mode if mode in MODES else None


def _mode_from_env(name: str) -> str:
    value = os.environ.get(name) or "auto"
    mode = mode_of(value)
    if mode is None:
        raise ValueError(f"{name} must be auto, 0 or 1, got {value!r}; unset it for auto")
    return mode


def _flag(name: str, default: bool) -> bool:
    """An on/off switch: ``0`` / ``1`` or a common spelling of one (true/false, on/off, yes/no);
    unset or empty gives ``default``. Anything else is an error, not read as "on": ``false`` must
    not keep a cache on, nor switch the kernels off."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    mode = mode_of(value)
    if mode not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}; unset it for {int(default)}")
    return mode == "1"


@dataclass
class Settings:
    """The switches in force (read from the environment at import)."""

    input_cache: bool = _flag("FGPLUGIN_INPUT_CACHE", True)
    skip_zero_rows: bool = _flag("FGPLUGIN_SKIP_ZERO_ROWS", True)
    sparse_input: str = _mode_from_env("FGPLUGIN_SPARSE_INPUT")
    cusparse: str = _mode_from_env("FGPLUGIN_CUSPARSE")
    block_adaptive: bool = _flag("FGPLUGIN_BLOCK_ADAPTIVE", True)
    wgmma: bool = not _flag("FGPLUGIN_NO_WGMMA", False)
    build_extension: bool = not _flag("FGPLUGIN_NO_EXTENSION", False)
    build_cuda: bool = not _flag("FGPLUGIN_NO_CUDA", False)
    verbose_build: bool = _flag("FGPLUGIN_VERBOSE_BUILD", False)


settings = Settings()


def set_input_cache(enabled: bool) -> bool:
    """Turns the reuse of a constant input's aggregation (fgplugin.input_cache) on or off for every
    layer; returns the previous setting. Kept aggregations are dropped by each layer's next call
    while it is off."""
    previous, settings.input_cache = settings.input_cache, bool(enabled)
    return previous


def set_sparse_input(mode) -> str:
    """Whether a layer's constant, mostly-zero input may be kept as a sparse matrix
    (fgplugin.sparse_input): ``"auto"`` (where it is faster: by a timed probe, and on an eager
    CUDA step, where the probe leaves the sparse form a chance, on the first training steps,
    fgplugin.form_trial), ``"0"`` / ``False``
    (never) or ``"1"`` / ``True`` (wherever it applies); returns the previous mode. Inputs the
    layers already keep stay as they are until their cache is refilled."""
    return _set_mode("sparse_input", mode, "set_sparse_input")


def set_cusparse(mode) -> str:
    """Whether a product may run on ``torch.sparse.mm`` (cuSPARSE) instead of fgplugin's kernel
    (fgplugin.cusparse): ``"auto"`` (for the widths where a timed probe finds it faster),
    ``"0"`` / ``False`` (never) or ``"1"`` / ``True`` (wherever it applies, on the CPU too: for
    tests); returns the previous mode. Choices made before stay with their adjacency."""
    return _set_mode("cusparse", mode, "set_cusparse")


def _set_mode(field: str, mode, setter: str) -> str:
    checked = mode_of(mode)
    if checked is None:
        raise ValueError(f"{setter} takes 'auto', '0' / False or '1' / True, got {mode!r}")
    previous = getattr(settings, field)
    setattr(settings, field, checked)
    return previous


def set_row_skipping(enabled: bool) -> bool:
    """Turns the skipping of zero output-gradient rows (fgplugin.grad_rows) on or off; returns the
    previous setting. A step captured before (``fgplugin.graphed_step``) replays what it captured."""
    previous, settings.skip_zero_rows = settings.skip_zero_rows, bool(enabled)
    return previous


def set_block_adaptive(enabled: bool) -> bool:
    """Whether CUDA products use the block-adaptive kernel (dense tiles + balanced remainder)
    rather than the plain CSR one; returns the previous setting."""
    previous, settings.block_adaptive = settings.block_adaptive, bool(enabled)
    return previous


def set_wgmma(enabled: bool) -> bool:
    """Whether unit-weight dense tiles on H100/H200 run on the wgmma kernel (else mma.sync);
    returns the previous setting. Takes effect at the next launch."""
    import torch

    previous, settings.wgmma = settings.wgmma, bool(enabled)
    if hasattr(torch.ops.fgplugin, "set_wgmma"):
        torch.ops.fgplugin.set_wgmma(settings.wgmma)
    return previous


def cache_dir() -> Path:
    """``$FGPLUGIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fgplugin`` or ``~/.cache/fgplugin``."""
    if os.environ.get("FGPLUGIN_CACHE_DIR"):
        return Path(os.environ["FGPLUGIN_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fgplugin"


def data_dir() -> Path | None:
    """``$FGPLUGIN_DATA_DIR`` as given (even if wrong, so that a bad setting shows up as an
    error), or ``None`` when unset."""
    value = os.environ.get("FGPLUGIN_DATA_DIR")
    return Path(value).expanduser() if value else None


def dist_timeout_s(default: float = 300.0) -> float:
    """``$FGPLUGIN_DIST_TIMEOUT`` in seconds, else ``default``."""
    value = os.environ.get("FGPLUGIN_DIST_TIMEOUT")
    try:
        return float(value) if value else float(default)
    except ValueError:
        raise ValueError(f"FGPLUGIN_DIST_TIMEOUT must be a number of seconds, got {value!r}") from None


def commit() -> str | None:
    """``$FGPLUGIN_COMMIT``, or ``None`` when unset."""
    return os.environ.get("FGPLUGIN_COMMIT") or None


def table() -> str:
    """The variables as a markdown table (the one in docs/design.md)."""
    lines = ["| variable | default | effect |", "|---|---|---|"]
    lines += [f"| `{v.name}` | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(lines)
