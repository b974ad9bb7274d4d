"""Which of two forms of a layer's kept input makes the user's own eager CUDA steps faster, timed
on those steps.

A layer's constant, mostly-zero input may be kept dense (``A x``: one GEMM forward, one for the
weight's gradient) or sparse (``x`` itself: four sparse products, fgplugin.sparse_input). Timed
alone, each form's cost is the larger of its host and device time; in an eager step it is not:
the host queues the next kernels while the device runs earlier ones, so on a graph whose step is
bound by host time the dense GEMMs' device time is hidden and the sparse form's extra host time is
not. H100, eager GCN steps, 12 graphs with bag-of-words features: the dense form was faster on 11
(citeseer 2.25 against 2.68 ms, oklahoma97 2.07 against 2.59) and level on coauthor_cs, while
timed alone the sparse form won on 4 of them (coauthor_cs 0.27 against 1.03 ms); in a captured
step, which replays device time alone, the sparse form won on 11 (docs/results.md section 28).

So where the sparse form may make an eager CUDA step faster (not a captured one, whose choice is
timed by device time alone; fgplugin.sparse_input.may_win_eager), the layer alternates the two
over its first training steps (21-53, in blocks: :class:`FormTrial` says why) and keeps the one
whose steps were faster; one trial runs at a time on a device (layers that read the same input
would time each other's forms), the others wait on their first form. A step's time is read from
CUDA events recorded at the layer's training calls: the device time between two of them is the
step's time whether the step is bound by the host (the device waits for launches between the
events) or by the device. Calls without autograd
(evaluation) are not counted, and a pair of steps of which only one had such calls is left out
(evaluation every few epochs would otherwise fall on one form's steps); a layer called only so
(inference) keeps the first form after a while. A CUDA graph captured meanwhile ends the trial
with the form in use, and ``fgplugin.set_sparse_input("0")`` / ``("1")`` with the form that mode
asks for.
"""
from __future__ import annotations

import statistics
import weakref

import torch

from .config import settings

BLOCK = 2  # steps in a row on one form, the last of them timed: its predecessor used the same form
WARM_UP_BLOCKS = 2  # one per form, untimed: a form's first steps load kernels and make the products'
# own first choices (cuSPARSE or fgplugin's kernel, the zero-row skipping)
LEAD = 4  # the trial ends when one form has won this many more pairs than the other
MAX_PAIRS = 12  # else after this many pairs, by the median difference
MAX_STEPS = BLOCK * (WARM_UP_BLOCKS + 2 * MAX_PAIRS)

_running: dict = {}  # device -> weak reference to the trial timing its steps now


class FormTrial:
    """Two kept forms of one input, ``first`` in use now. :meth:`on_call` at each of the layer's
    calls alternates them in blocks of ``BLOCK`` training steps, compares each timed step of the
    second form with the first form's just before it (a pair; a drift that slows the steps
    favours the first form, which a layer keeps without a trial), and answers the faster form once
    one has won ``LEAD`` pairs more than the other (21 steps at the least), else after
    ``MAX_PAIRS`` pairs by the median difference.

    Why so: a step's time moves by 10-20% over a few dozen steps of one process and by 5-10% from
    one step to the next, so the forms alternate (timed one after the other, the later one won by
    the drift) and enough pairs are taken (with 6, the slower form was kept in 5 of 30 trials);
    and a step's device work may still run while the host queues the next step (the dense form's
    weight-gradient GEMM on a host-bound step), which shortens the next step's time as the events
    read it, so only a step that follows a step on the same form is timed (alternated step by
    step, the sparse form was credited with the dense form's hidden work: 0.1-0.2 ms faster on
    coauthor_cs, cornell5 and facebook_pagepage, where its steps run as fast or slower). The
    pairs are read from events already done (``query``), so the trial syncs the host only once,
    if it runs to ``MAX_PAIRS``. A layer's repeated calls (fgplugin.layer_calls) run while it
    does, on the form in use, and count through the input cache as its full calls do: a block's
    timed step is then a repeated call of that form, as the form runs once kept. (Sending every
    call down the full path instead cost 52 against 19 us of host time per call on a 2-core CPU,
    benchmarks/results/cpu/form_trial_full_path_cpu.json, and 0.06-0.15 ms of a GCN forward's
    host time for the sparse form on an H100, benchmarks/results/h100/sparse_call_ab.json.)"""

    __slots__ = ("forms", "current", "_device", "_events", "_differences", "_pairs_read", "_uncounted",
                 "_waited", "__weakref__")

    def __init__(self, first, second, device: torch.device):
        self.forms = (first, second)
        self.current = first
        self._device = device
        self._events: list = []  # one per counted call; step i runs from event i to i + 1
        self._differences: list = []  # second form's timed step minus the first form's before it
        self._pairs_read = 0
        self._uncounted: set = set()  # steps in which the layer was also called without autograd
        self._waited = 0  # calls before its first timed step: evaluations, or waiting for another trial

    def on_call(self):
        """Notes one call of the layer; returns what to keep from now on: this trial while it
        runs, else the form whose training steps were faster. A CUDA graph captured meanwhile
        reads the form in use, which is then kept: switching would free what the graph reads."""
        if torch.cuda.is_current_stream_capturing():
            return self._end(self.current)
        if settings.sparse_input != "auto":  # the forms are (dense, sparse)
            return self._end(self.forms[settings.sparse_input == "1"])
        if not torch.is_grad_enabled():
            if self._events:
                self._uncounted.add(len(self._events) - 1)
                return self
            self._waited += 1
            # a model used for inference alone has no training steps to time: keep the first form,
            # and let the second go
            return self._end(self.forms[0]) if self._waited > 2 * MAX_STEPS else self
        running = _running.get(self._device)
        running = running() if running is not None else None
        if running is not None and running is not self:
            # another layer's trial times these steps: wait on the first form, unless that layer
            # has stopped training (a model built and left) for longer than a whole trial
            self._waited += 1
            if self._waited <= 2 * MAX_STEPS:
                return self
        _running[self._device] = weakref.ref(self)
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        step = len(self._events)  # the step this call starts
        self._events.append(event)
        if step == MAX_STEPS:
            event.synchronize()  # the last pair's steps must be done to read them
        self._read_pairs()
        negative = sum(d < 0 for d in self._differences)
        lead = negative - (len(self._differences) - negative)
        if abs(lead) >= LEAD:
            return self._end(self.forms[lead > 0])
        if self._pairs_read == MAX_PAIRS:
            faster = bool(self._differences) and statistics.median(self._differences) < 0
            return self._end(self.forms[faster])
        self.current = self.forms[step // BLOCK % 2]
        return self

    def _end(self, kept):
        running = _running.get(self._device)
        if running is not None and running() in (self, None):
            del _running[self._device]
        return kept

    def _read_pairs(self) -> None:
        """Adds the pairs whose steps' events are recorded and done on the device; a pair of
        which one step had uncounted calls and the other not gives no difference."""
        while self._pairs_read < MAX_PAIRS:
            second_block = WARM_UP_BLOCKS + 2 * self._pairs_read + 1
            end = (second_block + 1) * BLOCK  # the event that ends the second block's timed step
            if end >= len(self._events) or not self._events[end].query():
                return
            self._pairs_read += 1
            second = end - 1  # each block's last step is its timed one
            first = second - BLOCK
            if (second in self._uncounted) == (first in self._uncounted):
                self._differences.append(self._step_ms(second) - self._step_ms(first))

    def _step_ms(self, step: int) -> float:
        return self._events[step].elapsed_time(self._events[step + 1])


def current(kept):
    """The form a kept value stands for now: a trial's current form, else the value itself."""
    return kept.current if isinstance(kept, FormTrial) else kept
