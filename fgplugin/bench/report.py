"""Result files of ``fgplugin bench``: JSON (schema: docs/benchmarks.md), a markdown table, a PNG plot.

matplotlib is imported only when a plot is drawn; without it the plot is skipped with a note.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import torch

SCHEMA_KEYS = ("suite", "device", "torch", "cuda", "commit", "command", "rows")
COLUMNS = ["graph", "order", "impl", "op", "F", "hidden", "precision", "ms_median", "ms_min", "ms_max",
           "peak_mem_bytes", "host_us", "gpu_us", "bound", "value", "std", "vs_fgplugin", "dense_share", "break_even_epochs", "error"]


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"cpu ({os.cpu_count()} cores{', ' + model if model else ''})"


def result(suite: str, rows: list[dict], device, argv=None, commit: str | None = None, **extra) -> dict:
    """The result object (docs/benchmarks.md: ``suite``, ``device``, ``torch``, ``cuda``,
    ``commit``, ``command``, ``rows``; plus ``fgplugin_version``, ``threads``, ``loadavg`` and
    ``extra``). ``commit`` is what the caller was told (``--commit`` / ``$FGPLUGIN_COMMIT``) or
    ``None``."""
    import fgplugin

    argv = sys.argv if argv is None else argv
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    out = {"suite": suite, "device": device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
           "commit": commit, "fgplugin_version": fgplugin.__version__,
           "command": " ".join(shlex.quote(a) for a in argv), "threads": torch.get_num_threads(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "loadavg_start": extra.pop("loadavg_start", None),
           "loadavg_end": load}
    out.update(extra)
    out["rows"] = rows
    return out


def add_ratios(rows: list[dict]) -> None:
    """``vs_fgplugin`` on every epoch/train200 row: this impl's time / fgplugin's on the same graph,
    order, model and precision (> 1: fgplugin is faster)."""
    def key_of(r):
        return r.get("graph"), r.get("order"), r.get("op"), r.get("model"), r.get("precision")

    fg = {key_of(r): r["ms_median"] for r in rows if r.get("impl") == "fgplugin" and r.get("ms_median")}
    for r in rows:
        key = key_of(r)
        if r.get("op") in ("epoch", "train200") and r.get("ms_median") and fg.get(key):
            r["vs_fgplugin"] = r["ms_median"] / fg[key]


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value)


def markdown(res: dict, summary: str = "") -> str:
    rows = res["rows"]
    columns = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
    where = f"commit `{res['commit']}`" if res.get("commit") else "commit not recorded"
    lines = [f"# {res['suite']} on {res['device']}", "",
             f"fgplugin {res.get('fgplugin_version')}, torch {res['torch']}, CUDA {res.get('cuda')}, {where}, "
             f"{res.get('threads')} torch "
             f"threads, load average {res.get('loadavg_start')} at start, {res.get('loadavg_end')} at end.", "",
             f"Command: `{res['command']}`", ""]
    if res.get("note"):
        lines += [f"Note: {res['note']}", ""]
    if summary:
        lines += [summary, ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def epoch_summary(rows: list[dict]) -> str:
    """A graph x (impl, order) table of epoch ms with the fgplugin-reordered speedup over each;
    one per model and precision when the rows have several."""
    epoch = [r for r in rows if r.get("op") == "epoch"]
    if not epoch:
        return ""
    kinds = list(dict.fromkeys((r.get("model", "gcn"), r.get("precision", "fp32")) for r in epoch))
    if len(kinds) == 1:
        return _epoch_table(epoch)
    return "\n\n".join(f"Model `{m}`, {p}:\n\n" + _epoch_table(
        [r for r in epoch if (r.get("model", "gcn"), r.get("precision", "fp32")) == (m, p)]) for m, p in kinds)


def _epoch_table(epoch: list[dict]) -> str:
    graphs = list(dict.fromkeys(r["graph"] for r in epoch))
    keys = list(dict.fromkeys((r["impl"], r["order"]) for r in epoch))
    ms = {(r["graph"], r["impl"], r["order"]): r["ms_median"] for r in epoch}
    best = [k for k in keys if k[0] == "fgplugin" and k[1] != "original"] or [k for k in keys if k[0] == "fgplugin"]
    lines = ["Median ms per training step (forward + backward + Adam)"
             + (f"; in brackets: that time / fgplugin on `{best[0][1]}`" if best else "") + ".", "",
             "| impl | order | " + " | ".join(graphs) + " |", "|---|---|" + "---|" * len(graphs)]
    for impl, order in keys:
        cells = []
        for g in graphs:
            v = ms.get((g, impl, order))
            ref = ms.get((g, *best[0])) if best else None
            cells.append("-" if (g, impl, order) not in ms else "error" if v is None
                         else f"{v:.2f}" + (f" ({v / ref:.2f}x)" if ref else ""))
        lines.append(f"| {impl} | {order} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_summary(rows: list[dict]) -> str:
    acc = [r for r in rows if r.get("op") == "accuracy"]
    if not acc:
        return ""
    keys = list(dict.fromkeys((r["impl"], r["order"], r.get("precision", "fp32")) for r in acc))
    rows_of = list(dict.fromkeys((r["graph"], r.get("model", "gcn")) for r in acc))
    val = {(r["graph"], r.get("model", "gcn"), r["impl"], r["order"], r.get("precision", "fp32")): r for r in acc}
    lines = [f"Test accuracy, mean +- std over seeds {acc[0].get('seeds')} after {acc[0].get('epochs')} epochs.", "",
             "| graph | model | " + " | ".join(f"{i} ({o}{'' if p == 'fp32' else ', ' + p})" for i, o, p in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for g, model in rows_of:
        cells = []
        for k in keys:
            r = val.get((g, model, *k))
            cells.append("-" if r is None else "error" if r.get("value") is None
                         else f"{r['value']:.4f} +- {r['std']:.4f}")
        lines.append(f"| {g} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reorder_summary(rows: list[dict]) -> str:
    rs = [r for r in rows if r.get("op") == "preprocess" and ("dense_share" in r or r.get("error"))]
    if not rs:
        return ""
    lines = ["Reordering: preprocessing = reorder + tile plan; dense share = non-zeros in 32x32 tiles above 5%; "
             "break-even = preprocessing / (fgplugin epoch original - this order).", "",
             "| graph | order | reorder ms | plan ms | cache load ms | dense share | avg bandwidth | SpMM ms (F=128) "
             "| fgplugin epoch ms | break-even epochs | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append("| " + " | ".join(cell(r.get(k)) for k in ("graph", "order", "reorder_ms", "plan_ms", "cache_load_ms",
                                                                 "dense_share", "avg_bandwidth", "spmm_ms", "epoch_ms",
                                                                 "break_even_epochs", "error")) + " |")
    return "\n".join(lines)


def draw(res: dict, path: Path, log=print) -> bool:
    """Bar chart of epoch ms per graph (log scale), one bar per (impl, order, model, precision); False
    when skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"[report] matplotlib is not installed: no plot ({path.name}); `pip install matplotlib` to get one")
        return False
    if res["suite"] == "reorder":
        return False  # the table says it all
    rows = [r for r in res["rows"] if r.get("op") in ("epoch", "accuracy")]
    op = "epoch" if any(r["op"] == "epoch" for r in rows) else "accuracy"
    rows = [r for r in rows if r["op"] == op]
    if not rows:
        return False
    value = (lambda r: r.get("ms_median")) if op == "epoch" else (lambda r: r.get("value"))  # noqa: E731
    if not any(value(r) for r in rows):
        return False  # every row failed: nothing to draw
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    # a bar per impl, order, model and precision; the label names the last two where they vary
    keys = list(dict.fromkeys((r["impl"], r["order"], r.get("model"), r.get("precision")) for r in rows))
    varies = [len({k[i] for k in keys}) > 1 for i in (2, 3)]
    data = {(r["graph"], r["impl"], r["order"], r.get("model"), r.get("precision")): value(r) for r in rows}
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(graphs) * len(keys) / 4), 4.5))
    width = 0.8 / len(keys)
    for i, (impl, order, model, precision) in enumerate(keys):
        xs = [g + (i - (len(keys) - 1) / 2) * width for g in range(len(graphs))]
        ys = [data.get((g, impl, order, model, precision)) or 0 for g in graphs]
        label = ", ".join([order] + [v for v, shown in zip((model, precision), varies) if shown])
        ax.bar(xs, ys, width, label=f"{impl} ({label})", hatch="//" if order != "original" else None)
    ax.set_xticks(range(len(graphs)), graphs)
    if op == "epoch":
        ax.set_yscale("log")
        ax.set_ylabel("ms per training step (median)")
    else:
        ax.set_ylabel("test accuracy (mean over seeds)")
    ax.set_title(f"{res['suite']} on {res['device']}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(res: dict, out_dir, name: str | None = None, log=print, plot: bool = True) -> dict:
    """``<out>/<name>.json``, ``.md`` and ``.png``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or res["suite"]
    add_ratios(res["rows"])
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md"}
    paths["json"].write_text(json.dumps(res, indent=1) + "\n")
    summaries = {"reorder": (reorder_summary,)}.get(res["suite"], (epoch_summary, accuracy_summary))
    summary = "\n\n".join(s for s in (f(res["rows"]) for f in summaries) if s)
    paths["md"].write_text(markdown(res, summary))
    png = out_dir / f"{name}.png"
    if plot and draw(res, png, log):
        paths["png"] = png
    return paths


def failures(rows: list[dict]) -> list[str]:
    """One line per failed (graph, order, impl) and reason: ``graph / order / impl [ops]: error``
    (a row failed when it has an ``error``)."""
    groups: dict = {}
    for r in rows:
        if not r.get("error"):
            continue
        key = (r.get("graph", "-"), r.get("order", "-"), r.get("impl", "-"), str(r["error"]))
        ops = groups.setdefault(key, [])
        if r.get("op") and r["op"] not in ops:
            ops.append(r["op"])
    lines = []
    for (graph, order, impl, error), ops in groups.items():
        what = f"{graph} / {order} / {impl}" + (f" ({', '.join(ops)})" if ops else "")
        lines.append(f"{what}: {error}")
    return lines
