"""Our default ordering: label propagation in torch ops, then one contiguous id range per community.

Why: clustering orders are what create dense tiles (docs/results.md, "Reordering": METIS 42% in
159 s, three rounds of GPU label propagation 55-60% in 0.1 s on ~100M edges). Every step below is a sort,
gather or scatter over the edge list, so it runs on whatever device the graph is on.
"""
from __future__ import annotations

import torch

from ._graph import SymGraph, lexsort, sorted_unique


def community(
    graph: SymGraph, *, seed: int = 0, rounds: int = 8, max_size: int | None = 1024,
    group_size: int | None = 16384,
) -> torch.Tensor:
    r"""Cluster by synchronous label propagation; number clusters contiguously.

    Every node starts with its own label (a seeded random permutation of ``0..n-1``, so that the
    smallest-label tie-break is random with respect to node ids). Each round, every node takes the
    most frequent label among its neighbours and itself (its own label is one vote), ties to the
    smallest label. The own vote is what stops the two-cycles of synchronous updates (the two ends
    of an edge, or a star's hub and leaves, swapping labels forever). Against neighbour votes only
    (ties kept the current label), it raised the share of non-zeros in dense tiles on sparse
    graphs (Cora 30% -> 46%, PubMed 13% -> 25%) and changed dense ones by under 1%. Updating
    only a hashed half of the nodes per round, the usual damping, was measured as well: it
    converged more slowly and gave fewer dense tiles on every test graph.

    A label that already holds ``max_size`` nodes accepts no new nodes, so communities cannot
    merge into a few giant ones, which loses locality (Facebook100 Oklahoma97: 38% of non-zeros
    in dense tiles with the cap, 26% without).

    Communities are then grouped the same way: label propagation on the graph of communities
    (edge weights = edges between them, a group holds at most ``group_size`` nodes), and the
    groups' communities get neighbouring id ranges. Why: a row's edges that leave its community
    mostly go to a few related ones, and with those far away in id order every such edge gathers
    a row of X that is not in the L2 cache. On products-like the non-zeros within 16K ids of their
    row went from 56% to 82% and the forward SpMM (H100, F=128) from 9.46 to 7.25 ms at fp32, 5.46
    to 4.35 ms at bf16; archaea-like 13.4 -> 11.5 ms at fp32; reddit-like and proteins-like, whose
    remainders are mostly far edges, within 3% (benchmarks/results/h100/grouping_ab.json).

    The order is by group, then community, and inside a community by descending degree (ties by
    id): that packs each community's core into the first tiles of its block, which beat the
    original id order inside communities on every graph measured.

    Args:
        rounds: label propagation rounds; each is one sort of ``E + n`` int64 keys.
        max_size: community size cap, or ``None`` for no cap.
        group_size: size cap (in nodes) of a group of communities, or ``None`` to leave the
            communities in label order (no grouping).
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be >= 1 or None, got {max_size}")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be >= 1 or None, got {group_size}")
    labels = propagate_labels(graph, seed=seed, rounds=rounds, max_size=max_size)
    if group_size is None:
        return lexsort([labels, -graph.degree()])
    _, labels = torch.unique(labels, return_inverse=True)  # communities 0 .. k-1
    groups = group_communities(graph, labels, seed=seed, rounds=rounds, max_size=group_size)
    return lexsort([groups[labels], labels, -graph.degree()])


def group_communities(graph: SymGraph, labels: torch.Tensor, *, seed: int, rounds: int,
                      max_size: int) -> torch.Tensor:
    """Group label per community (``labels`` in ``[0, k)``) by label propagation on the graph of
    communities, weighted by the edges between them, with groups of at most ``max_size`` nodes."""
    k = int(labels.max()) + 1 if labels.numel() else 0
    if k == 0:
        return labels
    c_row, c_col = labels[graph.row], labels[graph.col]
    between = c_row != c_col
    pairs, weight = sorted_unique(c_row[between] * k + c_col[between], return_counts=True)
    contracted = SymGraph(pairs // k, pairs % k, k)
    return propagate_labels(contracted, seed=seed, rounds=rounds, max_size=max_size, edge_weight=weight,
                            node_size=torch.bincount(labels, minlength=k))


def propagate_labels(
    graph: SymGraph, *, seed: int, rounds: int, max_size: int | None, edge_weight: torch.Tensor | None = None,
    node_size: torch.Tensor | None = None,
) -> torch.Tensor:
    """Community label in ``[0, n)`` per node after at most ``rounds`` synchronous rounds; an
    edge's vote counts ``edge_weight`` (int64, default 1), a node counts ``node_size`` (default 1)
    towards ``max_size``."""
    n, device = graph.num_nodes, graph.device
    generator = torch.Generator(device=device).manual_seed(seed)
    labels = torch.randperm(n, generator=generator, device=device)
    # A self loop per node gives each node its own vote (and so at least one candidate).
    nodes = torch.arange(n, device=device)
    row, col = torch.cat([graph.row, nodes]), torch.cat([graph.col, nodes])
    weight = None
    if edge_weight is not None:
        # The own vote weighs as much as the strongest neighbour's, so a node that would follow it
        # ties with its own label, and the smaller label wins on both ends: no two-cycles.
        own = torch.ones_like(nodes).scatter_reduce_(0, graph.row, edge_weight, "amax")
        weight = torch.cat([edge_weight, own])
    for _ in range(rounds):
        # Mode finding by sorting: one key per (node, label of a neighbour or itself); the runs of
        # equal keys count the votes for each label. n * n < 2^63 for n < 3e9.
        keys = row * n + labels[col]
        if weight is None:
            pairs, votes = sorted_unique(keys, return_counts=True)
        else:
            pairs, inverse = torch.unique(keys, return_inverse=True)
            votes = torch.zeros(pairs.numel(), dtype=torch.long, device=device).index_add_(0, inverse, weight)
        node, label = pairs // n, pairs % n
        # One int64 score per candidate, so that a segment max picks the most votes, then the
        # smallest label: votes * n + n - 1 < 2^63 while votes * n < 2^63 (unit votes: votes <= n).
        score = votes * n + (n - 1 - label)
        if max_size is not None:
            # Full labels score 0 and lose: the node's own label, always allowed, scores >= n.
            size = torch.bincount(labels, weights=node_size, minlength=n)
            score.masked_fill_((size[label] >= max_size) & (label != labels[node]), 0)
        best = torch.zeros(n, dtype=torch.long, device=device)
        best.scatter_reduce_(0, node, score, "amax")
        new_labels = n - 1 - best % n
        if torch.equal(new_labels, labels):  # a fixed point: later rounds would change nothing
            break
        labels = new_labels
    return labels

