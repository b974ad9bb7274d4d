"""fgplugin.form_trial: an eager CUDA step keeps the form of a layer's constant input (dense A x or
sparse x) whose training steps ran faster, timed on those steps; the input cache keeps eager and
captured-step forms apart."""
import contextlib

import pytest
import torch

import fgplugin
from fgplugin import autotune, form_trial, input_cache, sparse_input
from fgplugin.form_trial import BLOCK, LEAD, MAX_PAIRS, MAX_STEPS, WARM_UP_BLOCKS, FormTrial
from fgplugin.testing import rel_error

CALLS_TO_DECIDE = MAX_STEPS + 1  # at most
CLEAR_WIN_CALLS = BLOCK * (WARM_UP_BLOCKS + 2 * LEAD) + 1  # one form faster in every pair
CPU = torch.device("cpu")


class FakeClockEvent:
    """A stand-in for ``torch.cuda.Event`` on a clock the test advances (``tick``). With ``lagging``
    set, no event is done until one recorded later is synchronized, as on a device that runs
    behind the host."""

    now = 0.0  # ms
    lagging = False
    done_until = float("-inf")

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = FakeClockEvent.now

    def elapsed_time(self, other):
        return other.at - self.at

    def query(self):
        return not FakeClockEvent.lagging or self.at <= FakeClockEvent.done_until

    def synchronize(self):
        FakeClockEvent.done_until = max(FakeClockEvent.done_until, self.at)


def tick(ms):
    FakeClockEvent.now += ms


@pytest.fixture
def fake_cuda_events(monkeypatch):
    monkeypatch.setattr(FakeClockEvent, "lagging", False)
    monkeypatch.setattr(torch.cuda, "Event", FakeClockEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(form_trial, "_running", {})
    previous = fgplugin.set_sparse_input("auto")
    yield
    fgplugin.set_sparse_input(previous)


def run_steps(trial, slow, ms=0.3, base=2.0):
    """Calls the trial once per simulated step of ``base`` ms, ``ms`` longer while ``slow`` is in
    use, until it settles; returns what it kept and how many calls it took."""
    for calls in range(1, 10 * CALLS_TO_DECIDE):
        tick(base + (ms if trial.current is slow else 0.0))
        kept = trial.on_call()
        if kept is not trial:
            return kept, calls
    raise AssertionError("the trial never settled")


@pytest.mark.parametrize("slow_first", [True, False])
def test_keeps_the_form_whose_steps_are_faster(fake_cuda_events, slow_first):
    dense, sparse = object(), object()
    kept, calls = run_steps(FormTrial(dense, sparse, CPU), slow=dense if slow_first else sparse)
    assert kept is (sparse if slow_first else dense)
    assert calls == CLEAR_WIN_CALLS


def test_the_forms_alternate_in_blocks(fake_cuda_events):
    dense, sparse = object(), object()
    trial = FormTrial(dense, sparse, CPU)
    used = [trial.current]
    while True:
        tick(3.0 if trial.current is sparse else 2.0)
        if trial.on_call() is not trial:
            break
        used.append(trial.current)
    assert used == [dense] + ([dense] * BLOCK + [sparse] * BLOCK) * (WARM_UP_BLOCKS // 2 + LEAD)


def test_forms_alike_are_timed_to_the_last_pair(fake_cuda_events):
    """Where neither form wins pairs by a lead, the trial takes MAX_PAIRS pairs and the median
    difference decides; it syncs only then, reading no pair before its events are done."""
    FakeClockEvent.lagging = True
    trial = FormTrial("dense", "sparse", CPU)
    for calls in range(1, CALLS_TO_DECIDE + 1):
        tick(2.0 + 0.01 * (calls % 3))  # no form is faster: the pairs' signs come and go
        kept = trial.on_call()
        if kept is not trial:
            break
        assert not trial._differences
    assert calls == CALLS_TO_DECIDE and trial._pairs_read == MAX_PAIRS and len(trial._differences) == MAX_PAIRS


def test_a_drift_of_the_host_speed_is_not_taken_for_a_form(fake_cuda_events):
    """Steps that get slower over the trial, the forms alike, by more over it than the forms
    differ: neither form wins by having its steps later or earlier."""
    dense, sparse = object(), object()
    for slow in (dense, sparse):
        trial = FormTrial(dense, sparse, CPU)
        for calls in range(1, CALLS_TO_DECIDE + 1):
            tick(2.0 + 0.05 * calls + (0.3 if trial.current is slow else 0.0))
            kept = trial.on_call()
            if kept is not trial:
                break
        assert kept is not slow and kept is not trial


def test_work_that_runs_into_the_next_step_is_timed_as_in_a_row(fake_cuda_events):
    """A dense step whose GEMM still runs while the next step is queued: the next step looks
    shorter by that much. In a row the dense form's steps are the faster; timed right after a
    dense step, the sparse form's would look faster. Only steps that follow their own form count."""
    dense, sparse = object(), object()
    trial, previous = FormTrial(dense, sparse, CPU), None
    for _ in range(CALLS_TO_DECIDE):
        tick(2.0 + (0.3 if trial.current is sparse else 0.6) - (0.6 if previous is dense else 0.0))
        previous = trial.current
        kept = trial.on_call()
        if kept is not trial:
            break
    assert kept is dense


@pytest.mark.parametrize("phase", range(4))
@pytest.mark.parametrize("slow", ["dense", "sparse"])
def test_an_evaluation_every_few_epochs_is_not_taken_for_a_form(fake_cuda_events, phase, slow):
    """An evaluation (calls without autograd) every 4 epochs falls on the same step of the
    trial's 4-step cycle: pairs with it in one step only are left out. The trial keeps the faster
    form, or, where every pair had it in one step only, the first form, having learnt nothing."""
    trial = FormTrial("dense", "sparse", CPU)
    for epoch in range(10 * CALLS_TO_DECIDE):
        tick(2.0 + (0.3 if trial.current == slow else 0.0))
        kept = trial.on_call()
        if kept is not trial:
            break
        if epoch % 4 == phase:
            with torch.no_grad():
                assert trial.on_call() is trial
            tick(2.0)
    faster = "sparse" if slow == "dense" else "dense"
    assert kept == faster if trial._differences else kept == "dense" and trial._pairs_read == MAX_PAIRS
    assert bool(trial._differences) == (phase % 2 == 0)  # the timed steps are the odd ones


def test_evaluation_calls_are_not_counted(fake_cuda_events):
    trial = FormTrial("dense", "sparse", CPU)
    with torch.no_grad():
        for _ in range(2 * MAX_STEPS):
            assert trial.on_call() is trial
    assert trial.current == "dense"
    assert run_steps(trial, slow="dense") == ("sparse", CLEAR_WIN_CALLS)


def test_inference_alone_keeps_the_first_form(fake_cuda_events):
    """A layer only ever called without autograd has no training steps to time: after a while
    it keeps the first form and lets the second go (a training call before then starts the timing:
    test_evaluation_calls_are_not_counted)."""
    idle = FormTrial("dense", "sparse", CPU)
    with torch.no_grad():
        for _ in range(2 * MAX_STEPS):
            assert idle.on_call() is idle
        kept = [idle.on_call() for _ in range(2)]
    assert kept[-1] == "dense"


def test_a_capture_keeps_the_form_in_use(fake_cuda_events, monkeypatch):
    """A CUDA graph captured during the trial reads the form in use: the trial ends with it."""
    trial = FormTrial("dense", "sparse", CPU)
    for _ in range(BLOCK + 1):
        trial.on_call()
    assert trial.current == "sparse"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert trial.on_call() == "sparse"


@pytest.mark.parametrize("mode, form", [("0", "dense"), ("1", "sparse")])
def test_the_sparse_input_switch_ends_a_trial(fake_cuda_events, mode, form):
    trial = FormTrial("dense", "sparse", CPU)
    for _ in range(BLOCK + 1):
        trial.on_call()
    fgplugin.set_sparse_input(mode)
    assert trial.on_call() == form


def test_one_trial_at_a_time_on_a_device(fake_cuda_events):
    """Two layers reading the same input in every step (two towers): the second waits on its first
    form while the first's trial times the steps, then runs its own."""
    first = FormTrial("dense", "sparse", CPU)
    second = FormTrial("dense", "sparse", CPU)
    settled = {}
    for calls in range(1, 3 * CALLS_TO_DECIDE):
        tick(2.0 + (0.4 if first.current == "dense" else 0.0) + (0.4 if second.current == "sparse" else 0.0))
        for name, trial in (("first", first), ("second", second)):
            if name not in settled:
                kept = trial.on_call()
                if kept is not trial:
                    settled[name] = (kept, calls)
        if "first" not in settled:
            assert second.current == "dense" and not second._events
        if len(settled) == 2:
            break
    assert settled["first"] == ("sparse", CLEAR_WIN_CALLS)
    assert settled["second"][0] == "dense"


def test_a_trial_left_running_does_not_hold_others_forever(fake_cuda_events):
    """A layer whose model stopped training mid-trial: another layer's trial waits two trials'
    worth of steps, then runs."""
    FormTrial("dense", "sparse", CPU).on_call()  # freed at once: its weak entry frees the device
    left = FormTrial("dense", "sparse", CPU)
    left.on_call()
    waiting = FormTrial("dense", "sparse", CPU)
    for _ in range(2 * MAX_STEPS):
        assert waiting.on_call() is waiting and not waiting._events
    kept, calls = run_steps(waiting, slow="sparse")
    assert kept == "dense"


def test_current_reads_through_a_trial():
    assert form_trial.current(FormTrial("a", "b", CPU)) == "a"
    assert form_trial.current("a") == "a" and form_trial.current(None) is None


@pytest.fixture
def sparse_auto():
    previous = fgplugin.set_input_cache(True), fgplugin.set_sparse_input("auto")
    yield
    fgplugin.set_input_cache(previous[0])
    fgplugin.set_sparse_input(previous[1])


def bag_of_words(n, features, density, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, features, generator=g) < density) * torch.rand(n, features, generator=g)


def test_eager_and_captured_forms_are_kept_apart(sparse_auto, monkeypatch):
    """A form chosen for an eager step is not read by a captured step's warm-up (its form is
    chosen by device time alone), and the other way round: the cache fills again. An evaluation
    (no autograd) reads either."""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import fgplugin.pyg as fp
    asked = []
    monkeypatch.setattr(sparse_input, "_sparse_is_faster",
                        lambda *args: asked.append(autotune.in_captured_step()) or False)
    n, features = 120, 400
    x, ei = bag_of_words(n, features, 0.01, 3), torch.randint(0, n, (2, 500), generator=torch.Generator().manual_seed(3))
    layer = fp.GCNConv(features, 8)
    for _ in range(3):
        layer(x, ei)
    eager_kept = input_cache.of(layer).value
    assert asked == [False] and isinstance(eager_kept, torch.Tensor)
    with autotune.for_captured_step():
        assert input_cache.of(layer).kept_for(x) is None
        for _ in range(3):
            layer(x, ei)
        assert asked == [False, True] and input_cache.of(layer).value is not eager_kept
        captured_kept = input_cache.of(layer).value
    with torch.no_grad():  # an evaluation between captured steps reads what they keep
        for _ in range(2):
            layer(x, ei)
    assert input_cache.of(layer).value is captured_kept and asked == [False, True]
    layer(x, ei)
    assert not input_cache.of(layer).holds  # back in an eager step: noted, built again on the next call
    layer(x, ei)
    assert asked == [False, True, False]


def test_a_layer_on_trial_counts_every_training_call(fake_cuda_events, sparse_auto, monkeypatch):
    """A layer whose kept input is on trial counts every call, its repeated calls
    (fgplugin.layer_calls) too, which run on the form in use; its outputs are those of that form,
    until a form is kept. (On the CPU no trial starts by itself: put in by hand.)"""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import torch_geometric.nn as pyg_nn
    import fgplugin.pyg as fp
    n, features = 120, 400
    x, ei = bag_of_words(n, features, 0.01, 5), torch.randint(0, n, (2, 500), generator=torch.Generator().manual_seed(5))
    monkeypatch.setattr(sparse_input, "_sparse_is_faster", lambda *args: False)  # the CPU's probe keeps it dense
    torch.manual_seed(5)
    stock, ours = pyg_nn.GCNConv(features, 8), fp.GCNConv(features, 8)
    ours.load_state_dict(stock.state_dict())
    for _ in range(3):
        ours(x, ei)
    cache = input_cache.of(ours)
    assert isinstance(cache.value, torch.Tensor) and not cache.on_trial
    trial = FormTrial(cache.value, sparse_input.SparseInput.of(x), CPU)
    cache._value = trial
    full_path = []
    aggregate = fp.gcn_conv.aggregate
    monkeypatch.setattr(fp.gcn_conv, "aggregate",
                        lambda *args, **kwargs: full_path.append(1) or aggregate(*args, **kwargs))
    with torch.no_grad():  # evaluations before any training step: counted as waiting, not timed
        ours(x, ei)
        ours(x, ei)  # repeated as decided
    assert trial._waited == 2 and not trial._events and len(full_path) == 1
    forms = []
    for calls in range(1, CALLS_TO_DECIDE + 1):
        tick(2.0 + (0.5 if isinstance(trial.current, torch.Tensor) else 0.0))
        out = ours(x, ei)
        assert rel_error(out, stock(x, ei)) < 1e-5
        forms.append(type(cache.value))
        if not cache.on_trial:
            break
        assert len(trial._events) == calls
        if calls == 3:  # an evaluation: its calls are noted, not timed (the second one repeated as decided)
            with torch.no_grad():
                ours(x, ei)
                ours(x, ei)
            assert trial._uncounted == {calls - 1} and len(trial._events) == calls
    assert isinstance(cache.value, sparse_input.SparseInput) and calls == CLEAR_WIN_CALLS
    assert set(forms) == {torch.Tensor, sparse_input.SparseInput}
    # every call repeated as decided, on the form in use, but the first in and out of each evaluation
    assert len(full_path) == 4


@pytest.mark.parametrize("dense_ms, sparse_ms, trial", [
    ((0.10, 0.30), (0.05, 0.40), False),  # saves 0.05 ms of device time for 0.40 of host time
    ((0.05, 0.30), (0.10, 0.20), False),  # saves nothing
    ((0.60, 0.30), (0.10, 0.20), True),  # saves 0.50 for 0.20
    ((0.40, 0.10), (0.25, 0.20), False),  # saves 0.15 for 0.20
    ((0.20, 0.30), None, False),  # can save at most 0.20, for at least 0.30
    ((0.40, 0.30), None, True),
])
def test_a_trial_only_where_the_sparse_form_may_win_an_eager_step(dense_ms, sparse_ms, trial):
    assert sparse_input.may_win_eager(dense_ms, sparse_ms) == trial


@pytest.fixture
def eager_cuda_input(sparse_auto, monkeypatch):
    """``(graph, x)``: a bag-of-words input that the eager rule takes for a CUDA one (CPU), with the
    CPU's probe refused."""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import fgplugin.pyg as fp
    n, features = 120, 400
    x, ei = bag_of_words(n, features, 0.01, 6), torch.randint(0, n, (2, 500), generator=torch.Generator().manual_seed(6))
    graph = fp.SAGEConv(features, 8)._aggregation((x, None), ei, (n, n))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is x or t.device.type == "cuda"))
    monkeypatch.setattr(sparse_input, "capturing", lambda t: False)
    monkeypatch.setattr(sparse_input, "_sparse_is_faster", lambda *args: pytest.fail("the CPU's probe asked"))
    return graph, x


def test_an_eager_cuda_fill_weighs_device_time_saved_against_host_time(eager_cuda_input, monkeypatch):
    """On an eager CUDA step the kept input is the dense form, without a trial, unless the sparse
    form saves more device time than its own host time; then the two go on trial. The sparse form
    is built and timed only where the dense form's times leave it a chance, and the zero-row
    skipping is off while the forms are timed."""
    graph, x = eager_cuda_input
    dense = torch.full(x.shape, 2.0)
    built, sparse_of = [], sparse_input.SparseInput.of
    monkeypatch.setattr(sparse_input.SparseInput, "of", staticmethod(lambda x: built.append(1) or sparse_of(x)))
    skipping = fgplugin.set_row_skipping(True)
    try:
        for costs, kept in [([(0.2, 0.3)], torch.Tensor), ([(1.0, 0.3), (0.8, 0.4)], torch.Tensor),
                            ([(1.0, 0.3), (0.2, 0.4)], FormTrial)]:
            given, skipping_seen = list(costs), []
            built.clear()

            def timed(run, device):
                skipping_seen.append(fgplugin.config.settings.skip_zero_rows)
                return given.pop(0)
            monkeypatch.setattr(autotune, "device_and_host_ms", timed)
            value = sparse_input.keep(graph, x, 8, 1, lambda: dense)
            assert not given and type(value) is kept  # each cost asked for, and no more
            assert len(built) == len(costs) - 1  # the sparse form built where it was timed, once
            assert (value if kept is torch.Tensor else value.forms[0]) is dense
            assert not any(skipping_seen) and fgplugin.config.settings.skip_zero_rows
    finally:
        fgplugin.set_row_skipping(skipping)


def test_running_out_of_memory_while_timing_the_forms_keeps_the_dense_form(eager_cuda_input, monkeypatch):
    """Out of GPU memory while the forms are timed: the dense form, built once, with the zero-row
    skipping restored."""
    graph, x = eager_cuda_input
    calls = []

    def out_of_memory(run, device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
    monkeypatch.setattr(autotune, "device_and_host_ms", out_of_memory)
    skipping = fgplugin.set_row_skipping(True)
    try:
        value = sparse_input.keep(graph, x, 8, 1, lambda: calls.append(1) or torch.ones(x.shape))
        assert isinstance(value, torch.Tensor) and calls == [1] and fgplugin.config.settings.skip_zero_rows
    finally:
        fgplugin.set_row_skipping(skipping)


def test_running_out_of_memory_in_the_dense_form_is_the_callers(eager_cuda_input, monkeypatch):
    """Where a trial is worth it and building ``dense()`` runs out of memory, the error reaches the
    caller (as it does without a sparse form), after one attempt."""
    graph, x = eager_cuda_input
    calls = []

    def dense():
        calls.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
    monkeypatch.setattr(sparse_input, "_worth_a_trial", lambda graph, x, *args: sparse_input.SparseInput.of(x))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        sparse_input.keep(graph, x, 8, 1, dense)
    assert calls == [1]


def test_device_and_host_time_are_read_apart(fake_cuda_events, monkeypatch):
    """``autotune.device_and_host_ms``: ``(device ms, host ms)`` per run, medians over the samples,
    on a run taking 0.4 ms of device time and 0.1 ms of host time (both clocks faked); it and
    ``cost_ms`` time the run on the device they are given, which need not be the current one."""
    host_clock, current, entered, outside = [0.0], [None], [], []

    @contextlib.contextmanager
    def on_device(device):  # torch.cuda.device: what runs inside is on `device`
        entered.append(device)
        current[0] = device
        yield
        current[0] = None

    def note_where(*args, **kwargs):
        if current[0] != on:
            outside.append(args)
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: host_clock[0])
    monkeypatch.setattr(torch.cuda, "synchronize", note_where)
    monkeypatch.setattr(torch.cuda, "device", on_device)
    monkeypatch.setattr(torch.cuda, "_sleep", note_where, raising=False)
    runs = []

    def run():
        note_where()
        runs.append(1)
        tick(0.4)
        host_clock[0] += 1e-4

    on = torch.device("cuda", 1)  # not the current device: the timing must move to it
    device_ms, host_ms = autotune.device_and_host_ms(run, on)
    assert device_ms == pytest.approx(0.4) and host_ms == pytest.approx(0.1)
    # untimed, host-timed, sizing, then the batches
    assert len(runs) == 3 + autotune.COST_SAMPLES * autotune.batch_for(0.4)
    assert autotune.cost_ms(run, on, warm_up=False) == pytest.approx(0.4)  # eager: the larger of the two
    assert entered and set(entered) == {on} and not outside


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA products: needs a CUDA device")
def test_a_small_input_keeps_the_dense_form_without_a_trial(sparse_auto, monkeypatch):
    """A bag-of-words input whose GEMMs take a few microseconds: the sparse form's four products
    cannot save more device time than their host time, so an eager CUDA step keeps the dense form
    from the start; the costs timed are real numbers."""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import fgplugin.pyg as fp
    n, features, device = 300, 800, torch.device("cuda")
    x = bag_of_words(n, features, 0.005, 7).to(device)
    ei = torch.randint(0, n, (2, 1500), generator=torch.Generator().manual_seed(7)).to(device)
    costs, timed = [], autotune.device_and_host_ms
    monkeypatch.setattr(autotune, "device_and_host_ms", lambda *args: costs.append(timed(*args)) or costs[-1])
    layer = fp.GCNConv(features, 16).to(device)
    for _ in range(3):
        layer(x, ei).sum().backward()
    assert 1 <= len(costs) <= 2 and all(0 < ms < 100 for c in costs for ms in c), costs
    assert not sparse_input.may_win_eager(*costs), costs
    cache = input_cache.of(layer)
    assert isinstance(cache.value, torch.Tensor) and not cache.on_trial


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the trial times CUDA steps: needs a CUDA device")
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_training_through_the_trial_matches_stock(sparse_auto, model, monkeypatch):
    """A bag-of-words input on CUDA: both forms are used, then one is kept; every step's output
    and the trained weights match stock PyG's (SGD), and evaluation calls in between change
    nothing."""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import torch_geometric.nn as pyg_nn
    import fgplugin.pyg as fp
    monkeypatch.setattr(sparse_input, "may_win_eager", lambda *costs: True)  # too small to win: tried anyway
    n, features, device = 300, 800, torch.device("cuda")
    x = bag_of_words(n, features, 0.005, 4).to(device)
    ei = torch.randint(0, n, (2, 1500), generator=torch.Generator().manual_seed(4)).to(device)
    make = {"gcn": lambda lib: lib.GCNConv(features, 16), "sage": lambda lib: lib.SAGEConv(features, 16)}[model]
    torch.manual_seed(4)
    stock, ours = make(pyg_nn).to(device), make(fp).to(device)
    ours.load_state_dict(stock.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (stock, ours)]
    cache, forms = input_cache.of(ours), set()
    for step in range(CALLS_TO_DECIDE + 4):
        outs = []
        for module, opt in zip((stock, ours), opts):
            opt.zero_grad()
            out = module(x, ei)
            out.square().mean().backward()
            opt.step()
            outs.append(out.detach())
        assert rel_error(outs[1], outs[0]) < 1e-5, step
        if cache.holds:
            forms.add(type(cache.value))
        with torch.no_grad():
            assert rel_error(ours(x, ei), stock(x, ei)) < 1e-5
    assert forms == {torch.Tensor, sparse_input.SparseInput}
    assert cache.holds and not cache.on_trial
    fresh = make(fp).to(device)
    with torch.no_grad():  # inference alone: no training steps to time, the dense form kept
        for _ in range(2 * MAX_STEPS + 3):
            fresh(x, ei)
    assert isinstance(input_cache.of(fresh).value, torch.Tensor) and not input_cache.of(fresh).on_trial
    for a, b in zip(stock.parameters(), ours.parameters()):
        assert rel_error(b, a) < 1e-4
