"""fgplugin.graphed_step: a whole training step captured as one CUDA graph and replayed gives the
eager step's losses and weights; where capture is impossible (no GPU, a syncing loss) it runs
eagerly and warns once, saying why."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import fgplugin
from fgplugin import grad_rows, graphed, input_cache, sparse_input
from fgplugin.graphed import GraphedStepWarning
from fgplugin.testing import clustered_case

pytest.importorskip("torch_geometric")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA GPU")
N, FEATURES, CLASSES, WARMUP, STEPS = 400, 16, 5, 3, 6


class _GCN(torch.nn.Module):
    def __init__(self, p_input=0.0):
        super().__init__()
        import fgplugin.pyg as fg
        self.conv1, self.conv2 = fg.GCNConv(FEATURES, 32, cached=True), fg.GCNConv(32, CLASSES, cached=True)
        self.p_input = p_input

    def forward(self, x, edge_index):
        x = F.dropout(x, self.p_input, self.training)
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _problem(device):
    case = clustered_case(21, n_src=N)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, FEATURES, generator=g).to(device)
    y = torch.randint(0, CLASSES, (N,), generator=g).to(device)
    train = (torch.rand(N, generator=g) < 0.2).to(device)
    return x, case.edge_index.to(device), y, train


def _model_and_reference(device, model_class=None):
    """The problem on ``device`` (training rows as an index), a seeded model and its copy for the
    eager reference loop."""
    x, edge_index, y, train = _problem(device)
    torch.manual_seed(0)
    model = (model_class or _GCN)().to(device)
    return x, edge_index, y, train.nonzero().squeeze(1), model, copy.deepcopy(model)


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def _eager_losses(model, x, edge_index, y, idx, steps, make_optimizer=_adam, schedule=None, before_step=None,
                  change=None):
    """Losses of the eager loop, with what a graphed step offers: a scheduler stepped after each
    step, a hook before the optimizer step, ``change(step)`` run before each step."""
    opt = make_optimizer(model.parameters())
    scheduler = schedule(opt) if schedule else None
    losses = []
    for i in range(steps):
        if change:
            change(i)
        opt.zero_grad()
        loss = F.cross_entropy(model(x, edge_index)[idx], y[idx])
        loss.backward()
        if before_step:
            before_step(model)
        opt.step()
        losses.append(float(loss.detach()))
        if scheduler:
            scheduler.step()
    return losses


def _graphed_losses(model, x, edge_index, y, idx, steps):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                 warmup=WARMUP)
    return step, [float(step()) for _ in range(steps)]


def test_on_the_cpu_the_step_runs_eagerly_with_one_warning(monkeypatch):
    monkeypatch.setattr(fgplugin.graphed, "_warned", set())  # once per reason and process: not another test's
    x, edge_index, y, idx, model, reference = _model_and_reference("cpu")
    with pytest.warns(GraphedStepWarning, match="CUDA graphs need the model and inputs on a CUDA device") as caught:
        step, losses = _graphed_losses(model, x, edge_index, y, idx, STEPS)
    assert caught[0].filename == __file__  # the warning points at the user's call, not at fgplugin
    assert step.graph is None and step.captures == 0 and step.capture_s is None
    assert "CUDA graphs need the model and inputs on a CUDA device" in step.fallback_reason
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]  # warm-up steps train too
    assert losses == pytest.approx(expected, rel=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason is not repeated
        _graphed_losses(_GCN(), x, edge_index, y, idx, 1)


def test_warmup_must_run_the_step_once():
    x, edge_index, y, train = _problem("cpu")
    model = _GCN()
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        fgplugin.graphed_step(model, torch.optim.Adam(model.parameters()), lambda out: out.sum(), x, edge_index,
                              warmup=0)


def test_the_optimizer_is_given_back_as_the_user_made_it():
    """What a capture switches on (capturable with the scalar state on the parameters' device,
    fused, lr as a tensor) is undone for eager steps: the state dict then loads into a fresh
    optimizer of the user's kind, which steps."""
    model = torch.nn.Linear(3, 2)
    for make in (lambda ps: torch.optim.Adam(ps, lr=0.01), lambda ps: torch.optim.NAdam(ps, lr=0.01)):
        opt = make(model.parameters())
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        switched = graphed._make_capturable(opt)
        assert switched and all(g["capturable"] for g in opt.param_groups)
        graphed._restore(opt, [], [], switched)
        assert not opt.param_groups[0]["capturable"]
        assert all(v.is_cpu for st in opt.state.values() for v in st.values() if v.dim() == 0)
        fresh = make(model.parameters())
        fresh.load_state_dict(opt.state_dict())
        model(torch.randn(4, 3)).sum().backward()
        fresh.step()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: a model on the one not current")
def test_a_model_on_a_gpu_that_is_not_the_current_one_is_captured():
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda:1")
    assert torch.cuda.current_device() == 0
    step, losses = _graphed_losses(model, x, edge_index, y, idx, STEPS)
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)


@CUDA
def test_a_captured_step_replays_the_eager_steps():
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    step, losses = _graphed_losses(model, x, edge_index, y, idx, STEPS)
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@CUDA
def test_a_default_adam_runs_its_fused_kernel_and_an_explicit_choice_is_kept():
    """Adam left at torch's default implementation replays with its fused kernel (the same update
    as eager default Adam); one given ``foreach=True`` keeps it."""
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                 warmup=WARMUP)
    losses = [float(step()) for _ in range(STEPS)]
    assert all(group["fused"] is True for group in opt.param_groups)
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

    other = _GCN().cuda()
    kept = torch.optim.Adam(other.parameters(), lr=0.01, foreach=True)
    fgplugin.graphed_step(other, kept, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index)
    assert [group["fused"] for group in kept.param_groups] == [None]


def test_the_fused_switch_leaves_cpu_parameters_and_other_optimizers_alone():
    model = _GCN()
    adam = torch.optim.Adam(model.parameters())
    rmsprop = torch.optim.RMSprop(model.parameters())
    graphed._use_fused_kernel(adam)
    graphed._use_fused_kernel(rmsprop)
    assert adam.param_groups[0]["fused"] is None  # CPU parameters: no fused CUDA kernel for them
    assert rmsprop.param_groups[0].get("fused") is None


@CUDA
@pytest.mark.parametrize("warmup", [1, WARMUP])
def test_a_sparse_input_is_captured(warmup):
    """A bag-of-words input kept sparse (fgplugin.sparse_input, forced on) is captured and replays
    the eager steps; with one warm-up step the input cache has only seen the input once, and keeps
    nothing inside the capture (it would be read unfilled before the first replay): the graph
    computes the first layer's aggregation instead."""
    x, edge_index, y, train = _problem("cuda")
    x = x * (torch.rand_like(x) < 0.1)
    idx = train.nonzero().squeeze(1)
    torch.manual_seed(0)
    model = _GCN().cuda()
    reference = copy.deepcopy(model)
    previous = fgplugin.set_sparse_input("1")
    try:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                     warmup=warmup)
        losses = [float(step()) for _ in range(STEPS)]
        kept = input_cache.of(model.conv1).value
        assert isinstance(step.graph, torch.cuda.CUDAGraph)
        assert isinstance(kept, sparse_input.SparseInput) == (warmup > 1) and (kept is None) == (warmup == 1)
        expected = _eager_losses(reference, x, edge_index, y, idx, warmup + STEPS)[warmup:]
    finally:
        fgplugin.set_sparse_input(previous)
    assert losses == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@CUDA
def test_input_dropout_and_bf16_autocast_are_captured():
    """PyG's gcn.py model (dropout on the input) under bf16 autocast: captured, and it trains."""
    x, edge_index, y, train = _problem("cuda")
    idx = train.nonzero().squeeze(1)
    model = _GCN(p_input=0.5).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx].float(), y[idx]), x, edge_index,
                                 autocast=torch.bfloat16)
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    losses = [float(step()) for _ in range(30)]
    assert losses[-1] < losses[0] * 0.9, losses


@CUDA
def test_a_loss_that_syncs_falls_back_to_eager_with_the_reason():
    """The capture fails after the dropout drew from the CUDA generator; the step runs eagerly
    and random ops outside a capture work afterwards (a failed capture leaves the generator in
    capture mode, where the next one raises "Offset increment outside graph capture")."""
    x, edge_index, y, train = _problem("cuda")
    model = _GCN(p_input=0.5).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.warns(GraphedStepWarning, match="runs eagerly") as caught:
        step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[train], y[train]), x, edge_index)
    # the sync's own error, not the one ending the capture after it
    assert "previous error" not in str(caught[0].message) and "capturing" in str(caught[0].message)
    assert caught[0].filename == __file__
    assert step.graph is None
    assert opt.param_groups[0]["capturable"] is False and opt.state[opt.param_groups[0]["params"][0]]["step"].is_cpu
    assert opt.param_groups[0]["fused"] is None  # the fused switch is undone for the eager steps
    assert isinstance(opt.param_groups[0]["lr"], float)  # and so is the learning rate on the GPU
    assert torch.randn(4, device="cuda").shape == (4,)
    first = float(step())
    for _ in range(10):
        last = float(step())
    assert last < first


@CUDA
def test_sgd_with_sparse_gradients_keeps_its_own_implementation():
    """SGD is not switched to its fused kernel, which refuses the sparse gradients its default
    takes (an Embedding(sparse=True)): the step trains, captured or eagerly."""
    emb = torch.nn.Embedding(300, 16, sparse=True).cuda()
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    idx = torch.randint(0, 300, (64,), device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphedStepWarning)  # the sparse backward may not capture
        step = fgplugin.graphed_step(emb, opt, lambda out: out.square().sum(), idx)
    before = emb.weight.detach().clone()
    for _ in range(3):
        step()
    assert opt.param_groups[0]["fused"] is None and not torch.equal(emb.weight, before)


def test_before_step_runs_between_backward_and_the_optimizer_step():
    x, edge_index, y, idx, model, reference = _model_and_reference("cpu")
    clip = lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)  # noqa: E731
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphedStepWarning)  # on the CPU the step runs eagerly
        step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                     before_step=lambda: clip(model))
    losses = [step() for _ in range(STEPS)]
    assert not any(loss.requires_grad for loss in losses)
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS, before_step=clip)[WARMUP:]
    assert [float(loss) for loss in losses] == pytest.approx(expected, rel=1e-6)


@CUDA
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_schedulers_hooks_and_returned_losses_follow_the_eager_steps(optimizer):
    """An Adam's learning rate lives on the GPU in a captured step, so a scheduler's updates reach
    the replays; SGD's is a float, and a change to it captures the step again. Gradient clipping
    runs inside the capture; each step returns its own loss (not the graph's, which the next
    replay overwrites)."""
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    make = (lambda p: torch.optim.Adam(p, lr=0.02)) if optimizer == "adam" else \
        (lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9))
    schedule = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)  # noqa: E731
    clip = lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)  # noqa: E731
    opt = make(model.parameters())
    scheduler = schedule(opt)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                 warmup=1, before_step=lambda: clip(model))
    scheduler.step()  # after the warm-up step, as the eager loop does
    losses = [step()]
    for _ in range(STEPS):
        scheduler.step()
        losses.append(step())
    assert len({loss.data_ptr() for loss in losses}) == len(losses)
    expected = _eager_losses(reference, x, edge_index, y, idx, STEPS + 2, make, schedule, clip)[1:]
    assert [float(loss) for loss in losses] == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert (step.captures == 1) == (optimizer == "adam")  # SGD captured again when its rate changed


@CUDA
def test_inputs_changed_in_place_are_seen_and_evaluation_between_steps_is_harmless():
    """New features copied into x after the capture train the model (the step captures itself
    again: it had kept the first layer's aggregation of the old x); an evaluation in inference
    mode between steps leaves the captured step intact."""
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    other = torch.randn_like(x)
    x_ref = x.clone()

    def change(i, features):
        if i == WARMUP + 2:
            features.copy_(other)

    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index)
    losses = []
    for i in range(WARMUP, WARMUP + STEPS):
        change(i, x)
        losses.append(float(step()))
        model.eval()
        with torch.inference_mode():
            model(torch.randn_like(x), edge_index)
        model.train()
    expected = _eager_losses(reference, x_ref, edge_index, y, idx, WARMUP + STEPS,
                             change=lambda i: change(i, x_ref))[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)


@CUDA
def test_the_captured_backward_keeps_to_the_loss_rows_and_runs_in_full_when_they_change(monkeypatch):
    """With the zero-row skipping on (its size floor lowered for this small graph), the captured
    backward product keeps to the rows the warm-up found; loss rows changed in place after the
    capture (now outside those rows) run the product in full too (its flag is set on the device):
    the replays follow the eager steps throughout."""
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": 0, "cpu": 0})
    found = []
    captured_restriction = grad_rows.captured_restriction
    monkeypatch.setattr(grad_rows, "captured_restriction",
                        lambda *args: found.append(captured_restriction(*args)) or found[-1])
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    idx_ref = idx.clone()
    taken = torch.zeros(N, dtype=torch.bool, device="cuda")
    taken[idx] = True
    others = (~taken).nonzero().squeeze(1)[:idx.numel()]

    def change(i, rows):
        if i == WARMUP + 3:
            rows.copy_(others)

    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                 warmup=WARMUP)
    losses = []
    for i in range(WARMUP, WARMUP + STEPS):
        change(i, idx)
        losses.append(float(step()))
    assert isinstance(step.graph, torch.cuda.CUDAGraph) and step.captures == 1
    assert step.capture_s > 0 and step.fallback_reason is None
    assert len(found) == 1 and found[0] is not None  # the one backward product, restricted
    expected = _eager_losses(reference, x, edge_index, y, idx_ref, WARMUP + STEPS,
                             change=lambda i: change(i, idx_ref))[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@CUDA
def test_the_graph_holds_its_restriction_after_eager_steps_evict_it(monkeypatch):
    """The restriction a captured backward reads is held with the graph: eager backward passes
    over the same graph with other loss rows evict it from fgplugin.grad_rows' kept ones, memory
    is allocated and written all over, and the replays still follow the eager steps."""
    import gc
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": 0, "cpu": 0})
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    evictor = copy.deepcopy(reference)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index,
                                 warmup=WARMUP)
    losses = [float(step())]
    held = [h for h in step._holds if isinstance(h, grad_rows._Kept)]
    assert len(held) == 1
    g = torch.Generator().manual_seed(9)
    for _ in range(grad_rows.MAX_KEPT + 1):  # new loss rows each time: new restrictions push the held one out
        rows = torch.randperm(N, generator=g)[:idx.numel()].cuda()
        F.cross_entropy(evictor(x, edge_index)[rows], y[rows]).backward()
    assert not any(k is held[0] for entry in grad_rows._restrictions.values() for k in entry.kept)
    del held
    gc.collect()
    junk = [torch.full((size,), 123456, dtype=torch.int32, device="cuda") for size in range(1, 4097, 7)]
    losses += [float(step()) for _ in range(STEPS - 1)]
    del junk
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)


@CUDA
def test_a_hold_from_another_thread_on_the_capturing_stream_reaches_the_capture():
    """Autograd runs a CUDA backward on a thread of its own, on the forward pass's stream: what a
    captured backward product holds there goes to the capture's collection."""
    import threading
    from fgplugin import capture_holds
    marker, holds, graph = object(), [], torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        stream = torch.cuda.current_stream()
        with capture_holds.collecting(holds):
            def hold_there():
                with torch.cuda.stream(stream):
                    capture_holds.hold(marker)
            thread = threading.Thread(target=hold_there)
            thread.start()
            thread.join()
            x.add_(1)
    assert any(h is marker for h in holds)


@CUDA
def test_a_weighted_graph_is_captured():
    """Edge weights are checked for NaN with a host sync, once per weights (not inside the
    capture): a GCN on a weighted edge_index is captured and replays the eager steps."""
    class Weighted(_GCN):
        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index, weight).relu(), edge_index, weight)

    x, edge_index, y, idx, model, reference = _model_and_reference("cuda", Weighted)
    weight = torch.rand(edge_index.shape[1], device="cuda") + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphedStepWarning)
        step, losses = _graphed_losses(model, x, edge_index, y, idx, STEPS)
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + STEPS)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)


@CUDA
def test_a_param_group_added_after_the_capture_trains_as_in_eager_mode():
    """The step after add_param_group trains eagerly (the new parameters' optimizer state is made
    there, not inside a capture, where every replay would make it anew) and captures again."""
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")

    def add_second_layer(opt, model):
        opt.add_param_group({"params": list(model.conv2.parameters())})

    def first_layer_adam(params):
        return torch.optim.Adam(list(params)[:2], lr=0.01)  # conv1's weight and bias

    opt = first_layer_adam(model.parameters())
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index)
    losses = [float(step()) for _ in range(2)]
    add_second_layer(opt, model)
    losses += [float(step()) for _ in range(STEPS)]
    assert step.captures == 2
    ref_opt = []

    def change(i):
        if i == WARMUP + 2:
            add_second_layer(ref_opt[0], reference)

    expected = _eager_losses(reference, x, edge_index, y, idx, WARMUP + 2 + STEPS,
                             lambda p: ref_opt.append(first_layer_adam(p)) or ref_opt[0], change=change)[WARMUP:]
    assert losses == pytest.approx(expected, rel=1e-5)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@CUDA
def test_a_step_that_changes_on_every_call_runs_eagerly():
    x, edge_index, y, idx, model, reference = _model_and_reference("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, edge_index)
    with pytest.warns(GraphedStepWarning, match="changed on 3 calls in a row") as caught:
        for i in range(5):
            opt.param_groups[0]["lr"] = 0.1 / (i + 2)
            step()
    assert caught[0].filename == __file__
    assert step.graph is None and step.captures == 1 + graphed.MAX_CAPTURES_IN_A_ROW - 1
    assert "changed on 3 calls in a row" in step.fallback_reason


@CUDA
def test_a_frozen_parameter_or_an_error_before_a_new_capture():
    """Freezing a parameter after the capture is seen (the replay would go on updating it); an
    error in the training step that precedes a new capture is raised, and the step runs eagerly
    from then on with the optimizer as the user made it."""
    x, edge_index, y, idx, model, _ = _model_and_reference("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    fail = []

    def loss_fn(out):
        if fail:
            raise RuntimeError("the user's loss failed")
        return F.cross_entropy(out[idx], y[idx])

    step = fgplugin.graphed_step(model, opt, loss_fn, x, edge_index)
    step()
    model.conv2.bias.requires_grad_(False)
    frozen = model.conv2.bias.detach().clone()
    step()
    step()
    assert step.captures == 2 and torch.equal(model.conv2.bias, frozen)
    fail.append(True)
    x.mul_(2.0)  # a change: the next call trains eagerly before capturing again, and that raises
    with pytest.raises(RuntimeError, match="the user's loss failed"):
        step()
    assert step.graph is None and isinstance(opt.param_groups[0]["lr"], float)
    fail.clear()
    assert torch.isfinite(step())
