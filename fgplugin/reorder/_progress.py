"""Progress bars for the long orderings (tqdm when installed; the result never depends on it)."""
from __future__ import annotations

# Auto progress bar: only where a run takes long enough for one to be useful.
LONG_RUN_EDGES = 10_000_000


def maybe_tqdm(items, show: bool, desc: str, total: int | None = None, unit: str = "block"):
    """``items``, wrapped in a tqdm bar when ``show`` and tqdm is installed."""
    if not show:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional: no bar, same result
        return items
    return tqdm(items, desc=desc, unit=unit, total=total)
