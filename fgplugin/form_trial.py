"""Which of two forms of a layer's kept input makes the user's own eager CUDA steps faster, timed
on those steps.

A layer's constant, mostly-zero input may be kept dense (``A x``: one GEMM forward, one for the
weight's gradient) or sparse (``x`` itself: four sparse products, fgplugin.sparse_input). Timed
alone, each form's cost is the larger of its host and device time; in an eager step it is not:
the host queues the next kernels while the device runs earlier ones, so on a graph whose step is
bound by host time the dense GEMMs' device time is hidden and the sparse form's extra host time is
not. H100, eager GCN steps, 12 graphs with bag-of-words features: the dense form was faster or
level on all 12 (citeseer 2.25 against 2.68 ms, cornell5 2.31 against 2.40-2.53), while timed
alone the sparse form won on 5 of them (coauthor_cs 0.27 against 1.03 ms); in a captured step,
which replays device time alone, the sparse form won on 10 (docs/results.md section 28).

So where both forms apply to an eager CUDA step (not a captured one, whose choice is timed by
device time alone), the layer alternates them over its first training steps and keeps the one
whose steps were faster. A step's time is read from CUDA events recorded at the layer's training
calls: the device time between two of them is the step's time whether the step is bound by the
host (the device waits for launches between the events) or by the device. Calls without autograd
(evaluation) are not counted; a CUDA graph captured meanwhile ends the trial with the form in use.
"""
from __future__ import annotations

import statistics

import torch

# Steps of each form that are not timed: a form's first steps load kernels and make the products'
# own first-call choices (cuSPARSE or fgplugin's kernel, the zero-row skipping).
WARM_UP_STEPS = 2
TIMED_STEPS = 8  # steps timed per form (their median decides)


class FormTrial:
    """Two kept forms of one input, ``first`` in use now. :meth:`on_call` at each of the layer's
    calls alternates them from one training step to the next, so that both see the same drift of
    the host's speed (steps of one process move by 10-20% over a few dozen steps), and after
    ``WARM_UP_STEPS + TIMED_STEPS`` steps of each answers the faster one."""

    __slots__ = ("forms", "current", "_device", "_events")

    def __init__(self, first, second, device: torch.device):
        self.forms = (first, second)
        self.current = first
        self._device = device
        self._events: list = []  # one per counted call; step i runs from event i to i + 1

    def on_call(self):
        """Notes one call of the layer; returns what to keep from now on: this trial while it
        runs, else the form whose training steps were faster. A CUDA graph captured meanwhile
        reads the form in use, which is then kept: switching would free what the graph reads."""
        if torch.cuda.is_current_stream_capturing():
            return self.current
        if not torch.is_grad_enabled():
            return self
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        used = len(self._events) % 2  # the form this call's step uses: first, second, first, ...
        self._events.append(event)
        if len(self._events) <= 2 * (WARM_UP_STEPS + TIMED_STEPS):
            self.current = self.forms[used]
            return self
        event.synchronize()  # once per trial: the last step's work must be done to read its time
        # step i runs from event i to event i + 1 with form i % 2
        timed = [(i % 2, a.elapsed_time(b)) for i, (a, b) in enumerate(zip(self._events, self._events[1:]))
                 if i >= 2 * WARM_UP_STEPS]
        first, second = (statistics.median(ms for form, ms in timed if form == f) for f in (0, 1))
        return self.forms[1] if second < first else self.forms[0]


def current(kept):
    """The form a kept value stands for now: a trial's current form, else the value itself."""
    return kept.current if isinstance(kept, FormTrial) else kept
