r"""Seeded community graphs at the scale of the benchmark suite (see docs/benchmarks.md).

The model, step by step (``p`` = a :class:`CommunityGraphParams`):

1. **Communities.** Sizes are drawn log-uniformly from ``p.community_size = (lo, hi)`` until they
   cover ``p.num_nodes`` (a last remainder smaller than ``lo`` joins the previous community).
   Consecutive runs of ``p.super_size`` (16) communities form a super-community. Before the final
   relabelling, node ids are grouped by community and communities by super-community, so each
   scope is a contiguous id range.
2. **Degrees.** Each node gets a weight ``w = U^{-1/(gamma-1)}`` (Pareto, ``gamma =
   p.power_law_exponent``, pdf ``~ w^-gamma``), capped so that no node's expected degree exceeds
   ``p.max_degree`` by more than a few percent (hubs in dense communities saturate earlier).
   Expected degrees are proportional to ``w`` with mean ``p.avg_degree``; the lightest nodes
   expect about a third of it, so ``tiny`` and ``small`` can have a few isolated nodes (as real
   graphs do) while the large presets have none in practice.
3. **Edges** (Chung-Lu style, so both endpoints follow the weights). A round draws, per node, a
   Poisson number of edge sources with mean ``m * w_i / sum(w)``. Each source picks a scope --
   its community with ``p.p_in`` (0.6), its super-community with ``p.p_near`` (0.25), the whole
   graph with ``p.p_far`` (0.15) -- and a target inside that scope with probability proportional
   to ``w``. Pairs are made undirected, self loops dropped, duplicates removed (sort of the int64
   key ``min*n + max``).
4. **Edge count.** Dedup loses pairs (hubs saturate their communities), so rounds repeat: the
   first draws ``m = target/2`` pairs, each later one draws ``deficit / yield`` where ``yield`` is
   the share of new unique pairs in the previous round. This approaches the target from below and
   stops within ``p.tolerance`` (1%); a graph that cannot get within 10% in ``p.max_rounds`` (8)
   rounds (too dense for its communities) raises ``ValueError``. ``meta`` records the rounds and
   the pairs drawn.
5. **Relabelling.** A uniformly random permutation of node ids is applied last, so the stored
   order carries no locality. Both directions are stored, sorted by (source, target).
6. **Labels, features, split.** Communities map to classes through a seeded shuffle
   (``class = shuffled_community_rank % num_classes``; every class gets ``>= 1`` community).
   Features are ``x_i = mu_{y_i} + p.feature_noise * eps_i`` with ``mu_c ~ N(0, I/F)`` and
   ``eps_i ~ N(0, I)``: two class means sit about 1.4 apart against unit noise per dimension, so a
   node's own features say little (an MLP stays far from perfect) while neighbourhood averages
   (60% of edges stay in the community) reveal the class. The split is a seeded random
   ``p.train_frac / p.val_frac / p.test_frac`` = 10% / 10% / 80% of all nodes.

Presets (:data:`SUITE`; directed edges = ``num_nodes * avg_degree``, within 10% after dedup):

==============  =========  ===========  ===  ==  ==============  ==========
name            nodes      dir. edges   F    C   community size  max degree
==============  =========  ===========  ===  ==  ==============  ==========
tiny            2,000      20,000       32   4   20 - 100        200
small           20,000     400,000      64   8   50 - 400        1,000
reddit-like     232,965    110,000,000  602  41  500 - 4,000     5,000
proteins-like   132,534    75,000,000   602  8   500 - 4,000     5,000
products-like   2,449,029  120,000,000  100  47  100 - 1,000     3,000
archaea-like    1,644,228  200,000,000  602  10  200 - 2,000     4,000
==============  =========  ===========  ===  ==  ==============  ==========

All presets share ``super_size=16, p_in=0.6, p_near=0.25, p_far=0.15, power_law_exponent=2.5,
feature_noise=1.0``. Same seed and same device type give the same graph (a ``torch.Generator``
on the target device drives every draw); CPU and CUDA graphs differ.

``GraphData.community`` holds the ground-truth community per node (after relabelling), only as the
"ideal order" reference for benchmarks: reorderings must never read it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .graph import GraphData

# Bounds the per-chunk temporaries of edge sampling (~8 arrays of this length).
_CHUNK = 1 << 23
# Rows of the feature matrix filled per step, so `mu[y]` never exists at full [N, F] size.
_FEATURE_ROWS = 1 << 16


@dataclass(frozen=True)
class CommunityGraphParams:
    """Parameters of :func:`community_graph`; see the module docstring for the model."""

    num_nodes: int
    avg_degree: float
    num_features: int
    num_classes: int
    community_size: tuple[int, int]
    max_degree: int
    super_size: int = 16
    p_in: float = 0.6
    p_near: float = 0.25
    p_far: float = 0.15
    power_law_exponent: float = 2.5
    feature_noise: float = 1.0
    train_frac: float = 0.1
    val_frac: float = 0.1
    test_frac: float = 0.8
    tolerance: float = 0.01
    max_rounds: int = 8

    @property
    def target_edges(self) -> int:
        """Target number of directed entries (both directions of every undirected edge)."""
        return round(self.num_nodes * self.avg_degree)


def _preset(nodes, edges, features, classes, community_size, max_degree) -> CommunityGraphParams:
    """A preset as its table row: ``edges`` = target directed entries."""
    return CommunityGraphParams(nodes, edges / nodes, features, classes, community_size, max_degree)


SUITE: dict[str, CommunityGraphParams] = {
    "tiny": _preset(2_000, 20_000, 32, 4, (20, 100), 200),
    "small": _preset(20_000, 400_000, 64, 8, (50, 400), 1_000),
    "reddit-like": _preset(232_965, 110_000_000, 602, 41, (500, 4_000), 5_000),
    "proteins-like": _preset(132_534, 75_000_000, 602, 8, (500, 4_000), 5_000),
    "products-like": _preset(2_449_029, 120_000_000, 100, 47, (100, 1_000), 3_000),
    "archaea-like": _preset(1_644_228, 200_000_000, 602, 10, (200, 2_000), 4_000),
}


def community_graph(
    name: str = "small",
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    **overrides,
) -> GraphData:
    r"""Generate the preset ``name`` of :data:`SUITE` (see the module docstring for the model).

    Args:
        name: a key of :data:`SUITE`.
        seed: seeds a ``torch.Generator`` on ``device``; same seed + device type = same graph.
        device: where to generate and return the graph (default CPU). Use ``"cuda"`` for the
            ~100M-edge presets. Measured on a 2-core CPU: tiny 0.02 s, small 0.15 s; without
            features, proteins-like 36 s, products-like 106 s, reddit-like ~2 min, archaea-like
            3.5 min with a 9 GB peak.
        **overrides: any field of :class:`CommunityGraphParams` (e.g. ``num_nodes=5000``);
            ``num_features=0`` skips the features (``x=None``).

    Returns:
        GraphData with ``edge_index`` sorted by (source, target), symmetric, without self loops
        or duplicates, ``y``, the masks, ``community`` and ``meta`` (parameters and generation log).
    """
    params = _resolve_params(name, overrides)
    device = torch.device("cpu" if device is None else device)
    gen = torch.Generator(device=device).manual_seed(seed)
    n = params.num_nodes

    sizes = _community_sizes(params, gen, device)
    num_comm = sizes.numel()
    if num_comm < params.num_classes:
        raise ValueError(
            f"community_graph({name!r}): {num_comm} communities cannot carry "
            f"{params.num_classes} classes; lower num_classes or community_size."
        )
    community = torch.repeat_interleave(torch.arange(num_comm, device=device), sizes)
    weights = _degree_weights(params, gen, device)
    class_of_comm = torch.randperm(num_comm, generator=gen, device=device) % params.num_classes

    pairs, log = _sample_undirected_pairs(params, sizes, community, weights, gen)
    perm = torch.randperm(n, generator=gen, device=device)  # new id of original node i = perm[i]
    edge_index = _relabel_symmetric_sorted(pairs, perm, n)
    del pairs

    community_new = torch.empty_like(community)
    community_new[perm] = community
    y = class_of_comm[community_new]
    train_mask, val_mask, test_mask = _random_split(params, gen, device)
    # Features draw last, so num_features=0 leaves the graph, labels and split unchanged.
    x = _class_features(params, y, gen) if params.num_features > 0 else None

    meta = {
        "generator": "community_graph",
        "preset": name,
        "seed": seed,
        "params": dataclasses.asdict(params),
        "num_communities": num_comm,
        "num_super_communities": -(-num_comm // params.super_size),
        **log,
    }
    return GraphData(
        name=name,
        edge_index=edge_index,
        num_nodes=n,
        x=x,
        y=y,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=params.num_classes,
        community=community_new,
        meta=meta,
    )


def _resolve_params(name: str, overrides: dict) -> CommunityGraphParams:
    if name not in SUITE:
        raise ValueError(f"unknown community_graph preset {name!r}; choose one of {sorted(SUITE)}.")
    fields = {f.name for f in dataclasses.fields(CommunityGraphParams)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"community_graph: unknown override(s) {unknown}; valid: {sorted(fields)}.")
    params = dataclasses.replace(SUITE[name], **overrides)
    for field in ("num_nodes", "num_features", "num_classes", "max_degree", "super_size", "max_rounds"):
        value, least = getattr(params, field), 0 if field == "num_features" else 1  # 0 features: structure only
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{field} must be an int >= {least}, got {value!r}.")
    for field in ("p_in", "p_near", "p_far", "train_frac", "val_frac", "test_frac"):
        if not 0.0 <= getattr(params, field) <= 1.0:
            raise ValueError(f"{field} must lie in [0, 1], got {getattr(params, field)!r}.")
    if not 0 < params.avg_degree < params.num_nodes - 1:
        raise ValueError(
            f"avg_degree must lie in (0, num_nodes - 1), got {params.avg_degree} "
            f"with num_nodes={params.num_nodes}."
        )
    lo, hi = params.community_size
    if not 1 <= lo <= hi:
        raise ValueError(f"community_size must satisfy 1 <= lo <= hi, got {params.community_size}.")
    if abs(params.p_in + params.p_near + params.p_far - 1.0) > 1e-6:
        raise ValueError(
            f"p_in + p_near + p_far must be 1, got "
            f"{params.p_in} + {params.p_near} + {params.p_far}."
        )
    if params.train_frac + params.val_frac + params.test_frac > 1.0 + 1e-9:
        raise ValueError("train_frac + val_frac + test_frac must not exceed 1.")
    if params.power_law_exponent <= 2.0:
        raise ValueError("power_law_exponent must be > 2 (the mean degree must be finite).")
    return params


def _community_sizes(p: CommunityGraphParams, gen, device) -> torch.Tensor:
    """Log-uniform sizes in ``p.community_size`` summing exactly to ``p.num_nodes``."""
    lo, hi = p.community_size
    # Every draw is >= lo, so this many always cover num_nodes.
    draws = -(-p.num_nodes // lo) + 1
    u = torch.rand(draws, generator=gen, device=device, dtype=torch.float64)
    sizes = torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))).round().long()
    ends = torch.cumsum(sizes, 0)
    # The first prefix that reaches num_nodes.
    count = int(torch.searchsorted(ends, torch.tensor([p.num_nodes], device=device))) + 1
    sizes = sizes[:count].clone()
    sizes[-1] = p.num_nodes - (ends[count - 2] if count > 1 else 0)
    if count > 1 and sizes[-1] < lo:
        sizes[-2] += sizes[-1]
        sizes = sizes[:-1]
    return sizes


def _degree_weights(p: CommunityGraphParams, gen, device) -> torch.Tensor:
    """Pareto weights; expected degree of node i = avg_degree * w_i / mean(w), hubs capped."""
    u = 1.0 - torch.rand(p.num_nodes, generator=gen, device=device, dtype=torch.float64)
    w = u.pow(-1.0 / (p.power_law_exponent - 1.0))
    cap = min(p.max_degree, p.num_nodes - 1) / p.avg_degree
    # Capping lowers the mean, which raises every expected degree a little; a second pass
    # brings the hubs back to (nearly) the cap.
    for _ in range(2):
        w = w.clamp(max=cap * w.mean().item())
    return w


def _sample_undirected_pairs(p, sizes, community, weights, gen):
    """Unique undirected pairs as sorted int64 keys ``min*n + max`` (original ids) and a log."""
    target_pairs = p.target_edges // 2
    cum = torch.cumsum(weights, 0)
    bounds = _scope_bounds(p, sizes, community, cum)
    keys = torch.empty(0, dtype=torch.long, device=weights.device)
    draw, drawn = target_pairs, []
    for _ in range(p.max_rounds):
        new = _draw_pairs(draw, weights, cum, bounds, p, gen)
        drawn.append(new.numel())
        before = keys.numel()
        keys = _sorted_unique(torch.cat([keys, new]))
        del new
        deficit = target_pairs - keys.numel()
        if deficit <= p.tolerance * target_pairs:
            break
        # Marginal yield falls as the graph fills, so draw/yield_ undershoots: no overshoot.
        yield_ = max((keys.numel() - before) / drawn[-1], 0.01)
        draw = min(math.ceil(deficit / yield_), 4 * target_pairs)
    if abs(2 * keys.numel() - p.target_edges) > 0.1 * p.target_edges:
        raise ValueError(
            f"community_graph reached only {2 * keys.numel():,} of {p.target_edges:,} directed "
            f"edges in {p.max_rounds} rounds: avg_degree={p.avg_degree:.1f} is too dense for "
            f"communities of {p.community_size}; lower avg_degree or max_degree, or raise "
            "community_size."
        )
    return keys, {"target_edges": p.target_edges, "rounds": len(drawn), "pairs_drawn": drawn}


def _scope_bounds(p, sizes, community, cum) -> tuple[torch.Tensor, torch.Tensor]:
    """Per node and scope (community, super-community, all), the [lo, hi) range of cumulative
    weight its targets are drawn from: two [n, 3] float64 tables."""
    # prefix[i] = total weight of nodes 0..i-1, so a node range [s, e) is [prefix[s], prefix[e]).
    prefix = torch.cat([cum.new_zeros(1), cum])
    comm_end = torch.cumsum(sizes, 0)
    comm_start = comm_end - sizes
    num_comm = sizes.numel()
    first = torch.arange(num_comm, device=sizes.device) // p.super_size * p.super_size
    last = (first + p.super_size - 1).clamp(max=num_comm - 1)
    sup_start, sup_end = comm_start[first], comm_end[last]
    zero, total = prefix[:1].expand(p.num_nodes), prefix[-1:].expand(p.num_nodes)
    lo = torch.stack([prefix[comm_start[community]], prefix[sup_start[community]], zero], 1)
    hi = torch.stack([prefix[comm_end[community]], prefix[sup_end[community]], total], 1)
    return lo, hi


def _draw_pairs(count, weights, cum, bounds, p, gen) -> torch.Tensor:
    """About ``count`` weighted pairs as unsorted keys ``min*n + max``, self loops dropped."""
    n, device = p.num_nodes, weights.device
    lo_tab, hi_tab = bounds
    # Poisson counts per node instead of weighted draws of sources: the sources come out sorted,
    # so scope lookups and target searches stay cache-local (3x faster on CPU).
    rate = weights * (count / cum[-1])
    src_all = torch.repeat_interleave(
        torch.arange(n, device=device), torch.poisson(rate, generator=gen).long()
    )
    out = torch.empty_like(src_all)
    filled = 0
    for start in range(0, src_all.numel(), _CHUNK):
        src = src_all[start : start + _CHUNK]
        r = torch.rand(src.numel(), generator=gen, device=device)
        scope = (r >= p.p_in).long() + (r >= p.p_in + p.p_near).long()
        del r
        flat = src * 3 + scope
        lo = lo_tab.view(-1)[flat]
        q = torch.rand(src.numel(), generator=gen, device=device, dtype=torch.float64)
        q.mul_(hi_tab.view(-1)[flat] - lo).add_(lo)
        del lo, flat, scope
        # Rounding can put q exactly on the upper bound: clamp keeps the id valid.
        dst = torch.searchsorted(cum, q, right=True).clamp_(max=n - 1)
        del q
        keep = src != dst
        a, b = src[keep], dst[keep]
        key = torch.minimum(a, b).mul_(n).add_(torch.maximum(a, b))
        out[filled : filled + key.numel()] = key
        filled += key.numel()
    return out[:filled]


def _sorted_unique(keys: torch.Tensor) -> torch.Tensor:
    keys = torch.sort(keys).values
    keep = torch.ones_like(keys, dtype=torch.bool)
    torch.ne(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _relabel_symmetric_sorted(pairs: torch.Tensor, perm: torch.Tensor, n: int) -> torch.Tensor:
    """Both directions of every pair, ids mapped through ``perm``, sorted by (source, target)."""
    u, v = perm[pairs // n], perm[pairs % n]
    keys = torch.cat([u * n + v, v * n + u])
    del u, v
    keys = torch.sort(keys).values
    edge_index = torch.empty(2, keys.numel(), dtype=torch.long, device=keys.device)
    torch.div(keys, n, rounding_mode="floor", out=edge_index[0])
    torch.remainder(keys, n, out=edge_index[1])
    return edge_index


def _class_features(p: CommunityGraphParams, y: torch.Tensor, gen) -> torch.Tensor:
    """``mu[y] + noise * eps`` with ``mu ~ N(0, I/F)``, filled in row blocks."""
    device, f = y.device, p.num_features
    mu = torch.randn(p.num_classes, f, generator=gen, device=device) / math.sqrt(f)
    x = torch.randn(p.num_nodes, f, generator=gen, device=device)
    x.mul_(p.feature_noise)
    for start in range(0, p.num_nodes, _FEATURE_ROWS):
        rows = slice(start, start + _FEATURE_ROWS)
        x[rows] += mu[y[rows]]
    return x


def _random_split(p: CommunityGraphParams, gen, device):
    order = torch.randperm(p.num_nodes, generator=gen, device=device)
    n_train = round(p.train_frac * p.num_nodes)
    n_val = round(p.val_frac * p.num_nodes)
    n_test = min(round(p.test_frac * p.num_nodes), p.num_nodes - n_train - n_val)
    bounds = [0, n_train, n_train + n_val, n_train + n_val + n_test]
    masks = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        mask = torch.zeros(p.num_nodes, dtype=torch.bool, device=device)
        mask[order[start:stop]] = True
        masks.append(mask)
    return tuple(masks)
