"""Optional timing of a distributed epoch per rank: block products, packing and *exposed* communication.

The kinds are those of :meth:`ShardedGraph.region <fgplugin.distributed.ShardedGraph.region>`.
Exposed communication is the time this rank's stream stood still waiting for a transfer or an
all-reduce (on CUDA: between an event recorded just before ``work.wait()`` and one just after it,
so transfers hidden behind compute cost nothing); waiting for a slower rank counts there too.
Off by default; a graph with ``profiler=None`` records nothing.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class Profiler:
    """Collects ``(kind, duration)`` intervals; :meth:`totals` syncs and sums them in ms."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._intervals: list[tuple[str, object, object]] = []
        self.bytes_received = 0

    @contextmanager
    def region(self, kind: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self._intervals.append((kind, start, end))

    def totals(self) -> dict[str, float]:
        """Milliseconds per kind since the last :meth:`reset` (syncs the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for kind, start, end in self._intervals:
            ms = start.elapsed_time(end) if self.cuda else 1e3 * (end - start)
            out[kind] = out.get(kind, 0.0) + ms
        return out

    def reset(self) -> None:
        self._intervals.clear()
        self.bytes_received = 0
