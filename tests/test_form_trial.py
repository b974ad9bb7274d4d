"""fgplugin.form_trial: an eager CUDA step keeps the form of a layer's constant input (dense A x or
sparse x) whose training steps ran faster, timed on those steps; the input cache keeps eager and
captured-step forms apart."""
import time

import pytest
import torch

import fgplugin
from fgplugin import autotune, form_trial, input_cache, sparse_input
from fgplugin.form_trial import BLOCK, LEAD, MAX_PAIRS, MAX_STEPS, WARM_UP_BLOCKS, FormTrial
from fgplugin.testing import rel_error

CALLS_TO_DECIDE = MAX_STEPS + 1  # at most
CLEAR_WIN_CALLS = BLOCK * (WARM_UP_BLOCKS + 2 * LEAD) + 1  # one form faster in every pair


class HostClockEvent:
    """A stand-in for ``torch.cuda.Event`` that reads the host's clock (the CPU runs synchronously).
    With ``lagging`` set, no event is done until one recorded later is synchronized, as on a
    device that runs behind the host."""

    lagging = False
    done_until = float("-inf")

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3

    def query(self):
        return not HostClockEvent.lagging or self.at <= HostClockEvent.done_until

    def synchronize(self):
        HostClockEvent.done_until = max(HostClockEvent.done_until, self.at)


@pytest.fixture
def host_clock_events(monkeypatch):
    monkeypatch.setattr(HostClockEvent, "lagging", False)
    monkeypatch.setattr(torch.cuda, "Event", HostClockEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def run_steps(trial, slow, ms=3.0):
    """Calls the trial once per simulated step, each step ``ms`` longer while ``slow`` is in use,
    until it settles; returns what it kept and how many calls it took."""
    for calls in range(1, 10 * CALLS_TO_DECIDE):
        if trial.current is slow:
            time.sleep(ms / 1e3)
        kept = trial.on_call()
        if kept is not trial:
            return kept, calls
    raise AssertionError("the trial never settled")


@pytest.mark.parametrize("slow_first", [True, False])
def test_keeps_the_form_whose_steps_are_faster(host_clock_events, slow_first):
    dense, sparse = object(), object()
    trial = FormTrial(dense, sparse, torch.device("cpu"))
    kept, calls = run_steps(trial, slow=dense if slow_first else sparse)
    assert kept is (sparse if slow_first else dense)
    assert calls == CLEAR_WIN_CALLS


def test_the_forms_alternate_in_blocks(host_clock_events):
    dense, sparse = object(), object()
    trial = FormTrial(dense, sparse, torch.device("cpu"))
    used = [trial.current]
    while True:
        time.sleep(0.003 if trial.current is sparse else 0.0)
        if trial.on_call() is not trial:
            break
        used.append(trial.current)
    assert used == [dense] + ([dense] * BLOCK + [sparse] * BLOCK) * (WARM_UP_BLOCKS // 2 + LEAD)


def test_forms_alike_are_timed_to_the_last_pair(host_clock_events):
    """Where neither form wins pairs by a lead, the trial takes MAX_PAIRS pairs and the median
    difference decides; it syncs only then, reading no pair before its events are done."""
    HostClockEvent.lagging = True
    trial = FormTrial("dense", "sparse", torch.device("cpu"))
    for calls in range(1, CALLS_TO_DECIDE + 1):
        time.sleep(0.001)
        kept = trial.on_call()
        if kept is not trial:
            break
        assert not trial._differences
    assert calls == CALLS_TO_DECIDE and kept in ("dense", "sparse") and len(trial._differences) == MAX_PAIRS


def test_a_drift_of_the_host_speed_is_not_taken_for_a_form(host_clock_events):
    """Steps that get slower over the trial, the forms alike (by more than the forms differ over
    it): neither form wins by having its steps later or earlier."""
    dense, sparse = object(), object()
    for slow in (dense, sparse):
        trial = FormTrial(dense, sparse, torch.device("cpu"))
        for calls in range(1, CALLS_TO_DECIDE + 1):
            time.sleep((0.5 + 0.05 * calls + (0.4 if trial.current is slow else 0.0)) / 1e3)
            kept = trial.on_call()
            if kept is not trial:
                break
        assert kept is not slow and kept is not trial


def test_work_that_runs_into_the_next_step_is_timed_as_in_a_row(host_clock_events):
    """A dense step whose GEMM still runs while the next step is queued: the next step looks
    shorter by that much. In a row the dense form's steps are the faster; timed right after a
    dense step, the sparse form's would look faster. Only steps that follow their own form count."""
    dense, sparse = object(), object()
    trial, previous = FormTrial(dense, sparse, torch.device("cpu")), None
    for _ in range(CALLS_TO_DECIDE):
        ms = 1.0 + (0.3 if trial.current is sparse else 0.6) - (0.6 if previous is dense else 0.0)
        previous = trial.current
        time.sleep(ms / 1e3)
        kept = trial.on_call()
        if kept is not trial:
            break
    assert kept is dense


def test_evaluation_calls_are_not_counted(host_clock_events):
    trial = FormTrial("dense", "sparse", torch.device("cpu"))
    with torch.no_grad():
        for _ in range(3 * CALLS_TO_DECIDE):
            assert trial.on_call() is trial
    assert trial.current == "dense"
    assert run_steps(trial, slow="dense") == ("sparse", CLEAR_WIN_CALLS)


def test_a_capture_keeps_the_form_in_use(host_clock_events, monkeypatch):
    """A CUDA graph captured during the trial reads the form in use: the trial ends with it."""
    trial = FormTrial("dense", "sparse", torch.device("cpu"))
    for _ in range(BLOCK + 1):
        trial.on_call()
    assert trial.current == "sparse"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert trial.on_call() == "sparse"


def test_current_reads_through_a_trial():
    assert form_trial.current(FormTrial("a", "b", torch.device("cpu"))) == "a"
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
    chosen by device time alone), and the other way round: the cache fills again."""
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
    layer(x, ei)
    assert not input_cache.of(layer).holds  # back in an eager step: noted, built again on the next call
    layer(x, ei)
    assert asked == [False, True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the trial times CUDA steps: needs a CUDA device")
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_training_through_the_trial_matches_stock(sparse_auto, model):
    """A bag-of-words input on CUDA: both forms are used, then one is kept; every step's output
    and the trained weights match stock PyG's (SGD), and evaluation calls in between change
    nothing."""
    pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
    import torch_geometric.nn as pyg_nn
    import fgplugin.pyg as fp
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
    for a, b in zip(stock.parameters(), ours.parameters()):
        assert rel_error(b, a) < 1e-4
