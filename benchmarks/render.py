"""Render a results JSON (BENCHMARKS.md schema) as a markdown table beside it.

    python benchmarks/render.py benchmarks/results/h100/spmm.json     # writes spmm.md
"""
import json
import sys
from pathlib import Path

COLUMNS = ["graph", "order", "impl", "op", "F", "precision", "threshold", "dense_share", "ms_median", "ms_min",
           "ms_max", "floor_ms", "x_floor", "rel_err", "error"]


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value)


def render(path: Path) -> str:
    result = json.loads(path.read_text())
    rows = result["rows"]
    columns = [c for c in COLUMNS if any(c in row for row in rows)]
    lines = [f"# {result['suite']} on {result['device']}", "",
             f"torch {result['torch']}, CUDA {result.get('cuda')}, commit `{result['commit']}`, copy bandwidth "
             f"{result.get('copy_TBps')} TB/s.", "", f"Command: `{result['command']}`", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for name in sys.argv[1:]:
        path = Path(name)
        path.with_suffix(".md").write_text(render(path))
