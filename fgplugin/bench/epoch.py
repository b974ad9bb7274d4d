"""The ``epoch`` suite: a 2-layer GCN's full-batch training step, every baseline, on the original
order and on fgplugin's reordered graph; accuracy parity on labelled graphs (the ``accuracy``
suite); and the cost and gain of each ordering (the ``reorder`` suite). See docs/benchmarks.md for
the method.

Graphs: the synthetic presets of :data:`fgplugin.datasets.SUITE` (generated, no files needed) or
real ``.npz`` graphs by name (looked up in ``$FGPLUGIN_DATA_DIR``) or path.

Per (graph, order, impl) it records:

- ``op="epoch"``: one training step (forward, cross-entropy on the training nodes, backward, Adam
  step); CUDA events on a GPU, ``time.perf_counter`` on the CPU; ``warmup`` steps first, then the
  median, min and max of ``epochs`` steps; ``peak_mem_bytes`` on a GPU (``None`` on the CPU): the
  impl's own peak, in both modes of ``rounds``: the device memory it holds once built and warmed
  up (``memory_allocated`` then, less before its build: model, graph structures, optimizer state,
  gradients, caches; for fgplugin on a reordered graph also the adjacency built with the
  reordering) plus the largest rise within a round of its timed steps (``max_memory_allocated``
  after ``reset_peak_memory_stats`` at the round's start, less ``memory_allocated`` then). The
  problem's shared tensors (features, labels, masks, edge_index) are not counted;
- ``op="preprocess"``: the order's reordering time (fgplugin's ``reorder``; 0 on the original
  order) plus the impl's own graph setup (``setup_ms``; fgplugin: the tile plan, the
  ``threshold="auto"`` probe and the CUDA kernel plans, ``baselines.fgplugin_adjacency``; DGL:
  the graph with self loops; the CSR baselines: their CSRs) plus the one-time costs below;
- ``op="train200"``: preprocessing + 200 x the median epoch (an estimate, ``estimated: true``).

One-time costs on the preprocess row, each counted in its ``ms_median``: ``first_use_ms``, what
an impl builds on first use (stock PyG ``GCNConv(cached=True)``'s ``gcn_norm``, dgl-path's
transposed CSR, the baselines' 16-bit value copies under autocast): the first training step
(``first_step_ms``: forward to the end of the optimizer step, synced, the first warm-up step; not
recorded with ``warmup=0``) less the median step (a captured row's median is a replay: less its
last warm-up step, an eager one; not recorded there with ``warmup`` under 3) and less the zero-row restrictions it built (counted in
``grad_rows_ms``); where a layer keeps its constant input's aggregation
(fgplugin.input_cache), the cost of building it (``input_cache_ms``: the step that builds it, less
a step that reuses it); where the last layer's backward product skips the zero rows of its
gradient (fgplugin.grad_rows), the time spent building that product's restricted structure in
the warm-up steps (``grad_rows_ms``); a captured step's capture (``capture_ms``).

A row that cannot run keeps its place with ``ms_median: None`` and ``error``.
"""
from __future__ import annotations

import gc
import itertools
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

import fgplugin
from fgplugin import autotune, grad_rows, input_cache, sparse_input

from . import baselines
from .baselines import FGPLUGIN_PYG, IMPLS, ImplUnavailable, captured

ACCURACY_GRAPHS = ("cora", "citeseer", "actor", "chameleon", "squirrel", "tolokers")  # real, labelled
CPU_GRAPHS = ("small",)  # synthetic: runs anywhere, no data files
GPU_GRAPHS = ("reddit-like", "products-like")
HIDDEN = {"reddit-like": 128, "proteins-like": 128, "archaea-like": 128, "products-like": 64}
SYNTHETIC_FEATURES = 128  # width of the seeded random features of graphs stored without x


def candidate_impls(device) -> tuple:
    """Every baseline, ``fgplugin-kernels``, ``fgplugin-dgl`` and on CPU ``fgplugin-torch-dropout``
    (on GPUs fgplugin's dropout is torch's): what :func:`default_impls` picks from."""
    variants = ("fgplugin-kernels", "fgplugin-dgl")
    if torch.device(device).type == "cpu":
        variants += ("fgplugin-torch-dropout",)
    return IMPLS + variants


def impl_availability(impls, device) -> tuple[tuple, dict]:
    """``(those of impls that can run on device, {reason: [impls left out for it]})``."""
    runnable, left_out = [], {}
    for impl in impls:
        why = baselines.unavailable(impl, device)
        if why is None:
            runnable.append(impl)
        else:
            left_out.setdefault(why, []).append(impl)
    return tuple(runnable), left_out


def default_impls(device, left_out: dict | None = None) -> tuple:
    """Those of :func:`candidate_impls` that can run here (their framework installed and able to
    run on ``device``); ``left_out``, when given, receives ``{reason: [impls]}`` of the others."""
    runnable, missing = impl_availability(candidate_impls(device), device)
    if left_out is not None:
        left_out.update(missing)
    return runnable


@dataclass
class Problem:
    """One node-classification graph in one order, on one device."""
    name: str
    order: str
    edge_index: torch.Tensor
    num_nodes: int
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    reorder_s: float = 0.0
    adj: object = None  # fgplugin.TiledAdjacency of this order (reordered graphs)
    plan_s: float = 0.0
    adj_bytes: int | None = None  # device memory adj holds (None off CUDA)
    note: str = ""

    @property
    def num_features(self) -> int:
        return self.x.shape[1]


def load(name: str, device, seed: int = 0) -> Problem:
    """A synthetic preset of ``fgplugin.datasets.SUITE`` (generated on ``device``) or a real
    ``.npz`` graph (name in ``$FGPLUGIN_DATA_DIR``, or path); seeded random features where the file
    has none, a seeded 10/10/80 train/val/test split where it has no split."""
    from fgplugin.datasets import load_graph

    device = torch.device(device)
    note = ""
    g = load_graph(name, device, seed)
    n = g.num_nodes
    x = g.x
    if x is None:
        x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, SYNTHETIC_FEATURES), dtype=np.float32))
        note = f"x missing: seeded random features F={SYNTHETIC_FEATURES}"
    y = g.y if g.y is not None else torch.zeros(n, dtype=torch.long)
    if g.train_mask is not None:
        train, test = g.train_mask, g.test_mask
    else:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        train = torch.zeros(n, dtype=torch.bool)
        test = torch.zeros(n, dtype=torch.bool)
        train[order[: n // 10]] = True
        test[order[n // 5:]] = True
        note = (note + "; " if note else "") + "no split in the file: seeded random 10/10/80 split"
    y = y.to(device)
    labelled = y >= 0
    return Problem(name=g.name, order="original", edge_index=g.edge_index.to(device),
                   num_nodes=n, x=x.to(device).contiguous(), y=y, train_mask=train.to(device) & labelled,
                   test_mask=test.to(device) & labelled, num_classes=max(int(y.max()) + 1, 2), note=note)


def reordered(problem: Problem, method: str, seed: int = 0, parts: int = 1) -> Problem:
    """``problem`` with node ids in ``method``'s order (fgplugin.reorder; block-wise over ``parts``
    ranges when > 1), with the tile plan built; ``reorder_s`` and ``plan_s`` record the two
    preprocessing times."""
    from fgplugin.reorder import inverse_permutation, reorder

    sync = _sync(problem.x.device)
    sync()
    start = time.perf_counter()
    perm = reorder(problem.edge_index, method, num_nodes=problem.num_nodes, parts=parts, seed=seed)
    sync()
    reorder_s = time.perf_counter() - start
    edge_index = inverse_permutation(perm)[problem.edge_index]
    before = _allocated(problem.x.device)
    start = time.perf_counter()
    adj = baselines.fgplugin_adjacency(edge_index, problem.num_nodes, perm=perm)
    sync()
    plan_s = time.perf_counter() - start
    adj_bytes = None if before is None else _allocated(problem.x.device) - before
    order = method if parts == 1 else f"{method}-blockwise{parts}"
    return replace(problem, order=order, edge_index=edge_index, x=problem.x[perm], y=problem.y[perm],
                   train_mask=problem.train_mask[perm], test_mask=problem.test_mask[perm], reorder_s=reorder_s,
                   adj=adj, plan_s=plan_s, adj_bytes=adj_bytes)


def reordered_as(problem: Problem, order: str, seed: int = 0) -> Problem:
    """:func:`reordered` by order name: ``<method>`` or ``<method>-blockwise<parts>``."""
    method, _, parts = order.partition("-blockwise")
    return reordered(problem, method, seed, int(parts) if parts else 1)


def _sync(device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _allocated(device) -> int | None:
    """Bytes of ``device`` memory that tensors hold now (``memory_allocated``), after a garbage
    collection, so that what is already unreachable (an earlier impl's cycles) is not counted and is
    not freed while another impl's memory is measured; ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    gc.collect()
    return torch.cuda.memory_allocated(device)


# Precisions of the epoch and accuracy suites: the dtype of torch.autocast around the forward
# (None: float32, no autocast).
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """``torch.autocast`` in ``precision``'s dtype on ``device``, or nothing for fp32."""
    dtype = AUTOCAST[precision]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str):
    """A ``GradScaler`` for fp16 (torch's AMP recipe), else ``None``."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def train_step(model, graph, problem: Problem, optimizer, precision: str = "fp32", scaler=None) -> None:
    """One full-batch step; bf16 / fp16 run the forward under ``torch.autocast`` (fp16's loss
    scaled by ``scaler``)."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(problem.x.device, precision):
        out = model(problem.x, graph)
    loss = F.cross_entropy(out[problem.train_mask].float(), problem.y[problem.train_mask])
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class WarmUpClock:
    """Times a model's first training steps (``seconds``, one per step): each from the start of
    its forward call to the end of its optimizer step, the device synced at both ends (``rows_s``:
    the zero-row restrictions built meanwhile, fgplugin.grad_rows). Hooks on the model and the
    optimizer (:meth:`watch`) see the steps wherever they run, in fgplugin.graphed_step's warm-up
    too, and remove themselves after the steps asked for, or at once inside a CUDA graph capture
    (which must not sync). A step whose optimizer step was skipped (fp16's GradScaler after an
    overflow) ends where the next forward starts."""

    def __init__(self, device: torch.device):
        self._sync, self._hooks, self._start, self._rows_before, self._left = _sync(device), [], None, 0.0, 0
        self.seconds, self.rows_s = [], []

    def watch(self, model, optimizer, steps: int = 1) -> None:
        self._left = steps
        self._hooks = [model.register_forward_pre_hook(self._on_forward),
                       optimizer.register_step_post_hook(self._stop)]

    def _on_forward(self, *_):
        if _capturing():
            self.close()
            return
        if self._start is not None:  # the previous step ended without an optimizer step
            self._stop()
            if not self._hooks:
                return
        self._sync()
        self._start, self._rows_before = time.perf_counter(), grad_rows.total_build_s()

    def _stop(self, *_):
        if self._start is None or _capturing():
            self.close()
            return
        self._record()
        if self._left <= 0:
            self.close()

    def _record(self) -> None:
        self._sync()
        self.seconds.append(time.perf_counter() - self._start)
        self.rows_s.append(grad_rows.total_build_s() - self._rows_before)
        self._start, self._left = None, self._left - 1

    def close(self) -> None:
        """Removes the hooks; a step begun and not ended by an optimizer step (fp16's GradScaler
        skipping the last warm-up step's) ends here, unless inside a capture."""
        if self._start is not None and not _capturing():
            self._record()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def warmed_up_step(model, graph, problem: Problem, warmup: int = 3, precision: str = "fp32", graphed: bool = False,
                   clock: WarmUpClock | None = None):
    """The model's training step (Adam, as the suites train), after ``warmup`` untimed steps;
    ``graphed``: the step captured as one CUDA graph by :func:`fgplugin.graphed_step` after the
    warm-up (its loss indexes the training rows, which a captured step needs, instead of masking
    them); ``clock`` times the first warm-up step, and where the step is captured every warm-up step
    (eager steps before the capture, against which the first one's one-time work is told apart)."""
    device = problem.x.device
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    scaler = grad_scaler(device, precision)
    if clock is not None:
        clock.watch(model, optimizer, steps=warmup if graphed else 1)

    def step():
        train_step(model, graph, problem, optimizer, precision, scaler)

    if graphed:
        if scaler is not None:
            raise ValueError("a captured step cannot use fp16's GradScaler (it syncs every step); use bf16")
        idx = problem.train_mask.nonzero().squeeze(1)
        return fgplugin.graphed_step(model, optimizer, lambda out: F.cross_entropy(out[idx].float(), problem.y[idx]),
                                     problem.x, graph, warmup=warmup, autocast=AUTOCAST[precision])
    for _ in range(warmup):
        step()
    return step


def timed(step, device: torch.device, steps: int):
    """``(ms per step list, memory rise)`` of ``steps`` calls of ``step``: CUDA events on a GPU,
    with the largest rise of allocated memory over what was allocated before them
    (``max_memory_allocated`` after ``reset_peak_memory_stats``, less ``memory_allocated`` then);
    the host clock elsewhere, with no rise (``None``)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in events], int(torch.cuda.max_memory_allocated(device)) - before
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - start))
    return times, None


def _loaded(graphs, device, seed: int, orders, impls, variants, fields: dict, rows: list, bar, on_error=None):
    """``(name, problem)`` of each graph that loads; for one that does not, its rows (every order,
    impl and (model, precision) of ``variants``, with ``fields`` and the reason) go into ``rows``
    and ``on_error(reason, name)`` is called."""
    for name in graphs:
        try:
            base = load(name, device, seed)
        except Exception as err:  # noqa: BLE001 - the graph's rows keep their places
            for model, precision in variants:
                rows += _failed_rows(name, orders, impls, {**fields, "model": model, "precision": precision},
                                     _error_text(err), bar)
            if on_error:
                on_error(_error_text(err), name)
            continue
        yield name, base


def _failed_rows(graph: str, orders, impls, fields: dict, error: str, bar) -> list[dict]:
    """The rows of a graph (or of some of its orders) that could not run: one per order and impl,
    with the reason."""
    rows = []
    for order in orders:
        for impl in impls:
            rows.append({"graph": graph, "order": order, "impl": impl, **fields, "error": error})
            if bar:
                bar.update()
    return rows


def _error_text(err: BaseException) -> str:
    if isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower():
        return "OOM"
    if isinstance(err, ImplUnavailable):
        return str(err)
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:200]}"


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_one(problem: Problem, impl: str, epochs: int, hidden: int, seed: int = 0, warmup: int = 3,
            model_name: str = "gcn", precision: str = "fp32") -> list[dict]:
    """The epoch, preprocess and train200 rows of one (graph, order, impl, model, precision)."""
    run = ImplRun(problem, impl, hidden, seed, warmup, model_name, precision)
    run.time(epochs)
    return run.finish()


def _can_capture(device: torch.device) -> bool:
    """Whether fgplugin.graphed_step captures a step on ``device`` (CUDA graphs: CUDA only)."""
    return device.type == "cuda"


class ImplRun:
    """One (graph, order, impl, model, precision) of the epoch suite: its model built and warmed up,
    timed in one or more rounds (:meth:`time`; the suite alternates the impls of a graph between
    rounds), then freed into its rows (:meth:`finish`). A failure anywhere becomes the rows'
    ``error``."""

    def __init__(self, problem: Problem, impl: str, hidden: int, seed: int = 0, warmup: int = 3,
                 model_name: str = "gcn", precision: str = "fp32"):
        self.problem, self.impl, self.warmup = problem, impl, warmup
        self.common = {"graph": problem.name, "order": problem.order, "impl": impl, "model": model_name,
                       "F": problem.num_features, "hidden": hidden, "precision": precision,
                       "nodes": problem.num_nodes, "nnz": problem.edge_index.shape[1]}
        self.times, self.error = [], None
        self.model = self.graph = self.step = None
        self.setup_s = self.rows_s = 0.0  # rows_s: zero-row restrictions built in this impl's steps
        self.capture_s = None  # a captured step's capture
        self.warm_up_clock = WarmUpClock(problem.x.device)
        # device memory (None off CUDA): held once built and warmed up; largest rise within a round of timed steps
        self.held_bytes = self.rise = None
        device = problem.x.device
        with self._shortcuts_as_impl():
            try:
                weights = baselines.reference_weights(problem.num_features, hidden, problem.num_classes, seed, device,
                                                      root=model_name == "sage")
                before = _allocated(device)
                adj = problem.adj if impl in FGPLUGIN_PYG else None
                self.model, self.graph, self.setup_s = baselines.build(impl, weights, problem.edge_index,
                                                                       problem.num_nodes, adj=adj, model=model_name)
                if impl in FGPLUGIN_PYG:
                    if adj is not None:
                        self.setup_s += problem.plan_s  # the tile plan was built with the reordering
                    self.common["threshold"] = self.graph.prepare()  # cached: the probe's choice (None off CUDA)
                torch.manual_seed(seed)
                if captured(impl):
                    self._capture(problem, warmup, precision)
                else:
                    self.step = warmed_up_step(self.model, self.graph, problem, warmup, precision,
                                               clock=self.warm_up_clock)
                self.warm_up_clock.close()  # with warmup=0 the first step is a timed one: no hooks there
                self.held_bytes = self._held_since(before, adj)
            except Exception as err:  # noqa: BLE001 - a failed row keeps its place
                self.error = _error_text(err)  # leaving the block drops the traceback and the tensors it holds
        if self.error is not None:
            self._release()

    def _capture(self, problem: Problem, warmup: int, precision: str) -> None:
        """The captured step (:func:`fgplugin.graphed_step`); the capture itself is timed as
        preprocessing (``capture_ms``; its warm-up steps are the warm-up every impl has). On CUDA
        a step that could not be captured is this row's error, not an eager row under a captured
        name."""
        self.step = warmed_up_step(self.model, self.graph, problem, warmup, precision, graphed=True,
                                   clock=self.warm_up_clock)
        self.capture_s = self.step.capture_s
        self.common["captured"] = self.step.graph is not None  # off CUDA the step runs eagerly
        if _can_capture(problem.x.device) and self.step.graph is None:
            raise RuntimeError(f"the step could not be captured: {self.step.fallback_reason}")

    def _held_since(self, before: int | None, adj) -> int | None:
        """Device memory allocated since ``before`` (this impl's model, graph, optimizer state,
        gradients and caches, once warmed up), plus ``adj``'s where the impl runs on the
        reordered graph's adjacency (built with the reordering, before any impl); ``None`` off
        CUDA."""
        now = _allocated(self.problem.x.device)
        if now is None:
            return None
        return now - before + (self.problem.adj_bytes if adj is not None else 0)

    @contextmanager
    def _shortcuts_as_impl(self):
        """The input cache and zero-row skipping on, or off for ``fgplugin-kernels``, while this impl
        runs; the restrictions built meanwhile counted as its preprocessing."""
        shortcuts = self.impl != "fgplugin-kernels"
        cache_was, skip_was = fgplugin.set_input_cache(shortcuts), fgplugin.set_row_skipping(shortcuts)
        built_before = grad_rows.total_build_s()
        try:
            yield
        finally:
            self.rows_s += grad_rows.total_build_s() - built_before
            fgplugin.set_input_cache(cache_was)
            fgplugin.set_row_skipping(skip_was)

    def time(self, steps: int) -> None:
        """Times ``steps`` more steps (a round), with the largest rise of memory within them."""
        if self.error is not None:
            return
        with self._shortcuts_as_impl():
            try:
                times, rise = timed(self.step, self.problem.x.device, steps)
                if captured(self.impl) and _can_capture(self.problem.x.device) and self.step.captures > 1:
                    raise RuntimeError("the step was captured again while timed (its inputs or optimizer changed)"
                                       + ("" if self.step.graph is not None else
                                          f", then ran eagerly: {self.step.fallback_reason}"))
            except Exception as err:  # noqa: BLE001
                self.error = _error_text(err)
        if self.error is not None:
            self._release()
            return
        self.times += times
        if rise is not None:
            self.rise = max(rise, self.rise or 0)

    def peak_mem_bytes(self) -> int | None:
        """The impl's own peak device memory: what it holds once built and warmed up plus the
        largest rise within a round of its timed steps (``None`` off CUDA)."""
        if self.held_bytes is None or self.rise is None:
            return None
        return self.held_bytes + self.rise

    def first_use_s(self, median_ms: float) -> float | None:
        """What the first step built on first use: its time less an eager step's (the median step;
        for a captured step, whose median is a replay, the last warm-up step) and less the zero-row
        restrictions built in either (counted in ``grad_rows_ms``); ``None`` where no first step
        was timed, or no plain eager step to tell it from (a captured step warmed up for fewer than
        3 steps: the second builds the input cache's kept aggregation)."""
        clock = self.warm_up_clock
        if not clock.seconds:
            return None
        first = clock.seconds[0] - clock.rows_s[0]
        if not captured(self.impl):
            return max(first - median_ms / 1e3, 0.0)
        if len(clock.seconds) < 3:  # step 2 builds a kept input aggregation: not yet a plain eager step
            return None
        return max(first - (clock.seconds[-1] - clock.rows_s[-1]), 0.0)

    def _release(self) -> None:
        """Frees the model, graph and step (a failed impl's at once: the other impls of the graph
        still run, in rounds mode, and need its memory)."""
        self.model = self.graph = self.step = None
        _free(self.problem.x.device)

    def finish(self) -> list[dict]:
        """The epoch, preprocess and train200 rows; frees the model."""
        kept = cache_s = None
        if self.error is None:
            with self._shortcuts_as_impl():
                try:
                    kept = kept_input(self.model)
                    cache_s = input_cache_build_s(self.model, self.graph, self.problem)
                except Exception as err:  # noqa: BLE001
                    self.error = _error_text(err)
        self._release()
        if self.impl == "fgplugin-sharded":
            baselines.end_one_rank_group()
        common = self.common
        if self.error is not None:
            return [{**common, "op": op, "ms_median": None, "error": self.error}
                    for op in ("epoch", "preprocess", "train200")]
        times = self.times
        median = statistics.median(times)
        first_use_s = self.first_use_s(median)
        pre_ms = 1e3 * (self.problem.reorder_s + self.setup_s + (cache_s or 0.0) + self.rows_s
                        + (self.capture_s or 0.0) + (first_use_s or 0.0))
        once = {} if cache_s is None else {"input_cache_ms": 1e3 * cache_s}
        if self.rows_s:
            once["grad_rows_ms"] = 1e3 * self.rows_s
        if self.capture_s is not None:
            once["capture_ms"] = 1e3 * self.capture_s
        if self.warm_up_clock.seconds:
            once["first_step_ms"] = 1e3 * self.warm_up_clock.seconds[0]
        if first_use_s is not None:
            once["first_use_ms"] = 1e3 * first_use_s
        return [
            {**common, "op": "epoch", "ms_median": median, "ms_min": min(times), "ms_max": max(times),
             "reps": len(times), "warmup": self.warmup, "peak_mem_bytes": self.peak_mem_bytes(),
             **({} if kept is None else {"kept_input": kept})},
            {**common, "op": "preprocess", "ms_median": pre_ms, "reorder_ms": 1e3 * self.problem.reorder_s,
             "setup_ms": 1e3 * self.setup_s, **once},
            {**common, "op": "train200", "ms_median": pre_ms + 200 * median, "estimated": True},
        ]


def kept_input(model) -> str | None:
    """How the model's layers keep a constant input (fgplugin.input_cache): ``"dense"`` (its
    aggregation), ``"sparse"`` (the input itself, fgplugin.sparse_input), ``" (on trial)"`` after
    the form in use where the two are still being timed (fgplugin.form_trial), several joined by
    ``+``, or ``None`` where none keeps one."""
    forms = sorted({("sparse" if isinstance(c.value, sparse_input.SparseInput) else "dense")
                    + (" (on trial)" if c.on_trial else "") for c in _held_caches(model)})
    return "+".join(forms) or None


def _held_caches(model) -> list:
    """The input caches of the model's layers that hold something."""
    caches = [input_cache.of(m) for m in model.modules() if "_fgplugin_input_cache" in m.__dict__]
    return [c for c in caches if c.holds]


def input_cache_build_s(model, graph, problem: Problem, reps: int = 3) -> float | None:
    """The one-time cost of the model's kept input aggregations (fgplugin.input_cache), or
    ``None`` where no layer keeps one: a forward pass that builds them (the cache cleared and
    the input seen once) less one that reuses them; the smallest of ``reps`` such differences."""
    caches = _held_caches(model)
    if not caches:
        return None
    sync = _sync(problem.x.device)

    def forward_s():
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            model(problem.x, graph)
        sync()
        return time.perf_counter() - start

    costs = []
    for _ in range(reps):
        for cache in caches:
            cache.clear()
        forward_s()  # sees the input once
        building = forward_s()
        costs.append(building - forward_s())
    return max(min(costs), 0.0)


def run_epoch_suite(graphs, impls=IMPLS, orders=("original", "community"), epochs: int = 20, device="cpu",
                    hidden: int | None = None, seed: int = 0, warmup: int = 3, progress=None, log=print,
                    checkpoint=None, models=("gcn",), precisions=("fp32",), rounds: int = 1) -> list[dict]:
    """All rows of the epoch suite, for each of ``models`` (baselines.MODELS) and ``precisions``
    (``AUTOCAST``); ``progress(total)`` returns a bar with ``update()`` (or None);
    ``checkpoint(rows)`` is called after each graph (to write partial results).

    ``rounds`` > 1 builds every impl of a graph first and times their ``epochs`` steps in that many
    rounds, the impls taking turns (in an order rotated by one each round), so that a slow spell of
    the host (launch-bound steps of a few ms moved by up to 24% within seconds on a lent H100) falls
    on all of them alike (``peak_mem_bytes`` counts each impl's own memory: see the module doc).
    ``rounds=1`` times one impl after the other, each alone in memory (the large graphs)."""
    device = torch.device(device)
    rows = []
    variants = [(m, p) for m in models for p in precisions]
    bar = progress(len(graphs) * len(orders) * len(impls) * len(variants)) if progress else None
    _warm_up_kernels(device)
    _warm_up_models(device, impls, models, orders, precisions)
    for name, base in _loaded(graphs, device, seed, orders, impls, variants, {"op": "epoch", "ms_median": None},
                              rows, bar):
        h = hidden or HIDDEN.get(name, 64)
        log(f"[epoch] {base.name}: {base.num_nodes:,} nodes, {base.edge_index.shape[1]:,} edges, F={base.num_features}, "
            f"classes={base.num_classes}, hidden={h}" + (f" ({base.note})" if base.note else ""))
        for order in orders:
            problem = base
            if order != "original":
                try:
                    problem = reordered_as(base, order, seed)
                    log(f"[epoch] {base.name}: reorder '{order}' {problem.reorder_s:.2f} s, tile plan "
                        f"{problem.plan_s:.2f} s, dense share {_dense_share(problem.adj):.3f}")
                except Exception as err:  # noqa: BLE001
                    for model, precision in variants:
                        rows += _failed_rows(base.name, [order], impls, {"op": "epoch", "model": model,
                                             "precision": precision, "ms_median": None},
                                             f"reorder failed: {_error_text(err)}", bar)
                    continue
            for model, precision in variants:
                for impl, new in _impl_rows(problem, impls, epochs, h, seed, warmup, model, precision, rounds):
                    if base.note:
                        for r in new:
                            r["note"] = base.note
                    rows += new
                    r = new[0]
                    status = f"{r['ms_median']:.2f} ms" if r["ms_median"] is not None else f"error: {r['error']}"
                    log(f"[epoch] {base.name} {order:<10} {model:<17} {precision:<4} {impl:<16} {status}")
                    if bar:
                        bar.update()
            del problem
            _free(device)
        if checkpoint:
            checkpoint(rows)
    if bar:
        bar.close()
    return rows


def _impl_rows(problem: Problem, impls, epochs: int, hidden: int, seed: int, warmup: int, model: str,
               precision: str, rounds: int):
    """``(impl, rows)`` of each impl on ``problem``: one after the other, or with ``rounds`` > 1
    built together and timed in turns (see :func:`run_epoch_suite`)."""
    if rounds <= 1:
        for impl in impls:
            yield impl, run_one(problem, impl, epochs, hidden, seed, warmup, model, precision)
        return
    runs = [ImplRun(problem, impl, hidden, seed, warmup, model, precision) for impl in impls]
    for r in range(rounds if runs else 0):
        steps = epochs // rounds + (r < epochs % rounds)
        turn = r % len(runs)  # each round starts with the next impl: no impl always runs first
        for run in runs[turn:] + runs[:turn]:
            run.time(steps)
    for run in runs:
        yield run.impl, run.finish()


def _warm_up_kernels(device: torch.device) -> None:
    """Preprocesses a tiny graph and runs a product, its gradient and a matmul, untimed, so that
    the first graph's ``preprocess`` row does not carry what a process pays once (CUDA loads each
    kernel on its first launch; cuBLAS and the caching allocator start up; H100: the first of the
    real graphs read 66 ms, the others 10-54)."""
    if device.type != "cuda":
        return
    problem = load("tiny", device)
    adj = baselines.fgplugin_adjacency(problem.edge_index, problem.num_nodes)
    x = problem.x.clone().requires_grad_()
    (fgplugin.spmm(adj, x @ x.t()[:, :16], *adj.norm("gcn", dtype=torch.float32))).sum().backward()
    torch.cuda.synchronize(device)
    del problem, adj, x
    _free(device)


def _warm_up_models(device: torch.device, impls, models, orders=("original",), precisions=("fp32",)) -> None:
    """Reorders a tiny graph in each of ``orders``, builds each impl's model on it and trains it for
    a few steps in each of ``precisions`` (captured where the impl's steps are), untimed: a process
    pays once for the first layer of a class it builds (PyG generates code for the class: 22-28 ms
    for a GCNConv, stock or fgplugin's, on the 2-core CPU), for the first reordering and threshold
    probe (CUDA loads their kernels on first launch: the first graph's community order took 68 ms of
    reordering and plans on an H100, the others 21-33) and for the first training step and capture
    of each impl's code (kernels loaded, the caching allocator's first blocks: with models only
    built here, stock PyG's first step on the first graph read 162 ms beyond its median step,
    2.8-6.6 ms on the others, and each captured impl held about 130 MB more on the first graph),
    which belongs to no graph's preprocessing. The tiny graph is probed as a graph above the probe's
    floor of non-zeros would be (``autotune.PROBE_MIN_NNZ``), so that its kernels are loaded here.
    Failures are left to the impl's own rows."""
    floor, autotune.PROBE_MIN_NNZ = autotune.PROBE_MIN_NNZ, 0
    try:
        _train_each_model_once(device, impls, models, orders, precisions)
    finally:
        autotune.PROBE_MIN_NNZ = floor


def _train_each_model_once(device: torch.device, impls, models, orders, precisions) -> None:
    base = load("tiny", device)
    for order in orders:
        try:
            problem = base if order == "original" else reordered_as(base, order)
        except Exception:  # noqa: BLE001 - the order's rows report it
            continue
        for impl in impls:
            if impl == "fgplugin-sharded":  # makes a process group; its layers are fgplugin's PyG ones
                continue
            for model, precision in itertools.product(models, precisions):
                weights = baselines.reference_weights(problem.num_features, 16, problem.num_classes, 0, device,
                                                      root=model == "sage")
                try:
                    net, graph, _ = baselines.build(impl, weights, problem.edge_index, problem.num_nodes, model=model,
                                                    adj=problem.adj if impl in FGPLUGIN_PYG else None)
                    graphed = captured(impl) and _can_capture(device)
                    warmed_up_step(net, graph, problem, warmup=2, precision=precision, graphed=graphed)()
                except Exception:  # noqa: BLE001 - the impl's rows report it
                    pass
                net = graph = None  # freed before the next model is built, and before _free
    base = problem = None
    _free(device)


def _dense_share(adj) -> float:
    try:
        return float(adj.dense_share)
    except Exception:  # noqa: BLE001
        return float("nan")


# ---------------------------------------------------------------- accuracy parity
def train_accuracy(impl: str, problem: Problem, epochs: int, hidden: int, seed: int, precision: str = "fp32",
                   model_name: str = "gcn") -> float:
    """Test accuracy of ``model_name`` (``baselines.MODELS``) after ``epochs`` full-batch epochs
    (Adam, lr 0.01, weight decay 5e-4, dropout 0.5); weights and dropout stream seeded by ``seed``.
    ``precision`` ``bf16`` or ``fp16`` runs the forward under ``torch.autocast`` in that dtype
    (fp16 with a ``GradScaler``, as torch's AMP recipe has it), for every impl alike."""
    weights = baselines.reference_weights(problem.num_features, hidden, problem.num_classes, seed, problem.x.device,
                                          root=model_name == "sage")
    model, graph, _ = baselines.build(impl, weights, problem.edge_index, problem.num_nodes,
                                      adj=problem.adj if impl == "fgplugin" else None, model=model_name)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    scaler = grad_scaler(problem.x.device, precision)
    model.train()
    for _ in range(epochs):
        train_step(model, graph, problem, optimizer, precision, scaler)
    model.eval()
    with torch.no_grad(), autocast(problem.x.device, precision):
        pred = model(problem.x, graph).argmax(dim=1)
    mask = problem.test_mask
    return float((pred[mask] == problem.y[mask]).float().mean())


def run_accuracy_suite(graphs=ACCURACY_GRAPHS, impls=("pyg-edge_index", "fgplugin"), orders=("original", "community"),
                       seeds=(0, 1, 2, 3, 4), epochs: int = 200, hidden: int = 64, device="cpu", progress=None,
                       log=print, precisions=("fp32",), models=("gcn",)) -> list[dict]:
    """Rows ``op="accuracy"`` (``value`` = mean test accuracy over ``seeds``, ``values`` each seed's,
    ``std``) for every (graph, order, model, impl, precision); the same seeds for every impl. Every impl runs on
    every order: a reordered graph gives the same function but puts each dropout mask on other
    nodes, so each order's own stock run is what fgplugin's compares with."""
    device = torch.device(device)
    rows = []
    variants = [(m, p) for m in models for p in precisions]
    bar = progress(len(graphs) * len(orders) * len(impls) * len(variants)) if progress else None
    for name, base in _loaded(graphs, device, 0, orders, impls, variants, {"op": "accuracy", "value": None}, rows, bar,
                              lambda err, name: log(f"[accuracy] {name}: error: {err}")):
        problems = {"original": base}
        for order in orders:
            if order != "original":
                try:
                    problems[order] = reordered_as(base, order, 0)
                except Exception as err:  # noqa: BLE001
                    problems[order] = f"reorder failed: {_error_text(err)}"
        for order in orders:
            for model, precision in variants:
                for impl in impls:
                    row = {"graph": base.name, "order": order, "impl": impl, "op": "accuracy", "model": model,
                           "F": base.num_features, "hidden": hidden, "precision": precision, "epochs": epochs,
                           "seeds": list(seeds)}
                    what = f"[accuracy] {base.name} {order:<10} {model:<17} {precision:<4} {impl:<16}"
                    start = time.perf_counter()
                    try:
                        if isinstance(problems[order], str):
                            raise RuntimeError(problems[order])
                        values = [train_accuracy(impl, problems[order], epochs, hidden, s, precision, model)
                                  for s in seeds]
                        row.update(value=statistics.mean(values), std=statistics.pstdev(values), values=values,
                                   seconds=time.perf_counter() - start)
                        log(f"{what} {row['value']:.4f} +- {row['std']:.4f}")
                    except Exception as err:  # noqa: BLE001
                        row.update(value=None, error=_error_text(err))
                        log(f"{what} error: {row['error']}")
                    rows.append(row)
                    if bar:
                        bar.update()
    if bar:
        bar.close()
    return rows


# ---------------------------------------------------------------- reorder suite
SPMM_FEATURES = 128  # the F of the reorder suite's SpMM timing (the spmm suite's headline width)


def spmm_ms(adj, seed: int = 0, reps: int = 20, features: int = SPMM_FEATURES) -> float:
    """Median ms of ``fgplugin.spmm(adj, x)`` (plain sum, fp32, ``x``: ``n x features`` seeded
    normal) after a warm-up call: CUDA events on the GPU, wall clock on the CPU."""
    from fgplugin import spmm

    device = adj.device
    x = torch.randn(adj.shape[1], features, generator=torch.Generator().manual_seed(seed)).to(device)
    spmm(adj, x)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            spmm(adj, x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            spmm(adj, x)
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


REORDER_METHODS = ("degsort", "slashburn", "rcm", "metis", "community")


def run_reorder_suite(graphs, methods=REORDER_METHODS, epochs: int = 20, device="cpu", hidden: int | None = None,
                      seed: int = 0, warmup: int = 3, progress=None, log=print, checkpoint=None) -> list[dict]:
    """Per graph and ordering: reorder time, tile-plan time, cache load time, quality
    (``dense_share`` from :func:`fgplugin.reorder.tile_density` at 32x32 / 5%, ``plan_dense_share`` of
    the tile plan, bandwidths), fgplugin's SpMM (``spmm_ms``, F=128) and epoch on that order, and break-even epochs = preprocessing
    / (fgplugin epoch on the original order - on this order) (``None`` when the order is no faster).
    Methods may carry Algorithm 2's block-wise form as ``<method>-blockwise<parts>``."""
    import tempfile

    from pathlib import Path

    from fgplugin import TiledAdjacency
    from fgplugin.cache import save_entry
    from fgplugin.preprocess import cache_key, reorder_graph
    from fgplugin.reorder import tile_density

    device = torch.device(device)
    rows = []
    bar = progress(len(graphs) * (1 + len(methods))) if progress else None
    for name in graphs:
        try:
            base = load(name, device, seed)
        except Exception as err:  # noqa: BLE001 - the graph's rows keep their places
            for order in ("original", *methods):
                rows.append({"graph": name, "order": order, "impl": "fgplugin", "op": "preprocess",
                             "ms_median": None, "error": _error_text(err)})
                if bar:
                    bar.update()
            log(f"[reorder] {name}: error: {_error_text(err)}")
            if checkpoint:
                checkpoint(rows)
            continue
        h = hidden or HIDDEN.get(name, 64)
        common = {"graph": base.name, "impl": "fgplugin", "F": base.num_features, "hidden": h, "precision": "fp32",
                  "nodes": base.num_nodes, "nnz": base.edge_index.shape[1]}
        orig = run_one(base, "fgplugin", epochs, h, seed, warmup)[0]
        quality = tile_density(base.edge_index, base.num_nodes)
        spmm_orig = spmm_ms(TiledAdjacency.from_edge_index(base.edge_index, base.num_nodes), seed)
        rows.append({**common, "order": "original", "op": "preprocess", "ms_median": 0.0, **quality,
                     "spmm_ms": spmm_orig, "epoch_ms": orig["ms_median"], "error": orig.get("error")})
        log(f"[reorder] {base.name} original: epoch {orig['ms_median']} ms, dense share {quality['dense_share']:.3f}")
        if bar:
            bar.update()
        for method in methods:
            row = {**common, "order": method, "op": "preprocess"}
            try:
                plain, _, parts = method.partition("-blockwise")
                parts = int(parts) if parts else 1
                problem = reordered(base, plain, seed, parts)
                quality = tile_density(problem.edge_index, base.num_nodes)
                with tempfile.TemporaryDirectory() as folder:
                    # The entry reorder_graph would write (same construction), without reordering again.
                    key = cache_key(base.edge_index, base.num_nodes, method=plain, parts=parts, seed=seed)
                    save_entry(Path(folder) / f"{key}.pt", key, problem.adj.cpu())
                    _sync(device)()
                    start = time.perf_counter()
                    reorder_graph(base.edge_index, base.num_nodes, method=plain, parts=parts, seed=seed, cache=folder)
                    _sync(device)()
                    cache_ms = 1e3 * (time.perf_counter() - start)
                    if len(list(Path(folder).iterdir())) != 1:  # reorder_graph missed the entry and built anew
                        raise RuntimeError("the reorder suite's cache entry was not the one reorder_graph reads")
                ep = run_one(problem, "fgplugin", epochs, h, seed, warmup)[0]
                pre_ms = 1e3 * (problem.reorder_s + problem.plan_s)
                gain = (orig["ms_median"] - ep["ms_median"]) if orig["ms_median"] and ep["ms_median"] else None
                row.update(ms_median=pre_ms, reorder_ms=1e3 * problem.reorder_s, plan_ms=1e3 * problem.plan_s,
                           cache_load_ms=cache_ms, **quality, plan_dense_share=_dense_share(problem.adj),
                           spmm_ms=spmm_ms(problem.adj, seed), spmm_ms_original=spmm_orig,
                           epoch_ms=ep["ms_median"], epoch_ms_original=orig["ms_median"],
                           break_even_epochs=(pre_ms / gain) if gain and gain > 0 else None)
                if ep.get("error"):
                    row["error"] = f"epoch: {ep['error']}"
                log(f"[reorder] {base.name} {method}: {pre_ms:.0f} ms, dense share {quality['dense_share']:.3f}, "
                    f"epoch {ep['ms_median']} ms, break-even {row['break_even_epochs']}")
            except Exception as err:  # noqa: BLE001
                row.update(ms_median=None, error=_error_text(err))
                log(f"[reorder] {base.name} {method}: error {row['error']}")
            rows.append(row)
            if checkpoint:
                checkpoint(rows)
            if bar:
                bar.update()
        del base
        _free(device)
    if bar:
        bar.close()
    return rows
