import itertools
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse
import torch

from fgplugin.reorder import METHODS, reorder, tile_density
from fgplugin.testing import graph_cases
from fgplugin.tiling import TiledAdjacency


def _clique(nodes: torch.Tensor) -> torch.Tensor:
    pairs = torch.cartesian_prod(nodes, nodes)
    return pairs[pairs[:, 0] != pairs[:, 1]].t()


def _two_cliques(size: int = 12) -> torch.Tensor:
    """Two disjoint cliques with their ids interleaved (even ids, odd ids)."""
    even, odd = torch.arange(0, 2 * size, 2), torch.arange(1, 2 * size, 2)
    return torch.cat([_clique(even), _clique(odd)], 1)


def _star(n: int = 31) -> torch.Tensor:
    """Hub 5 (not 0, so that keeping the given order cannot pass) joined to every other node."""
    leaves = torch.arange(1, n)
    return torch.stack([torch.full_like(leaves, 5), leaves.where(leaves != 5, 0)])


def _planted(seed: int = 0, n: int = 2000, size: int = 100, k_in: int = 16, k_random: int = 2):
    """Communities of ``size`` nodes, ~k_in in-community and ~k_random random neighbours per node,
    undirected, ids randomly permuted (so the given order carries no locality)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.arange(n).repeat_interleave(k_in // 2)
    dst = (src // size) * size + torch.randint(0, size, (src.numel(),), generator=g)
    noise = torch.randint(0, n, (2, n * k_random // 2), generator=g)
    edge_index = torch.cat([torch.stack([src, dst]), noise], 1)
    edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
    return torch.randperm(n, generator=g)[edge_index], n


def _cases():
    cases = [(c.name, c.edge_index, c.num_nodes) for c in graph_cases() if c.is_square]
    odd = torch.randint(0, 23, (2, 60), generator=torch.Generator().manual_seed(1))
    cases += [("star", _star(), 31), ("two_cliques", _two_cliques(), 24), ("odd_size", odd, 23)]
    return cases


CASES = _cases()


def _assert_permutation(perm: torch.Tensor, n: int):
    assert perm.dtype == torch.int64 and perm.shape == (n,)
    assert torch.equal(perm.sort().values, torch.arange(n, device=perm.device))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_valid_blockwise_permutation(method, case):
    _, edge_index, n = case
    for parts in (1, 2, 4):
        if parts > max(n, 1):
            with pytest.raises(ValueError, match="parts must be"):
                reorder(edge_index, method, num_nodes=n, parts=parts)
            continue
        perm = reorder(edge_index, method, num_nodes=n, parts=parts)
        _assert_permutation(perm, n)
        for i in range(parts):  # Algorithm 2: every id stays in its range
            s, e = i * n // parts, (i + 1) * n // parts
            assert torch.equal(perm[s:e].sort().values, torch.arange(s, e))


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_and_structure_only(method):
    edge_index, n = _planted(n=600, size=60)
    perm = reorder(edge_index, method, num_nodes=n, seed=3)
    assert torch.equal(perm, reorder(edge_index, method, num_nodes=n, seed=3))
    # One direction of every edge, plus self loops and duplicates: the same symmetric pattern.
    one_way = edge_index[:, edge_index[0] < edge_index[1]]
    loops = torch.arange(0, n, 7).repeat(2, 1)
    noisy = torch.cat([one_way.flip(0), loops, one_way[:, :100]], 1)
    assert torch.equal(perm, reorder(noisy, method, num_nodes=n, seed=3))
    # scipy and CSR-object (TiledAdjacency) inputs, with arbitrary weights.
    weights = np.random.default_rng(0).random(edge_index.shape[1])
    dst, src = edge_index.numpy()[::-1]
    csr = scipy.sparse.csr_matrix((weights, (dst, src)), shape=(n, n))
    assert torch.equal(perm, reorder(csr, method, seed=3))
    assert torch.equal(perm, reorder(TiledAdjacency.from_edge_index(edge_index, n), method, seed=3))


def test_degsort_and_slashburn_put_the_hub_first():
    star = _star()
    assert reorder(star, "degsort", num_nodes=31)[0] == 5
    assert reorder(star, "slashburn", num_nodes=31)[0] == 5
    edge_index = torch.tensor([[0, 1, 1, 2, 3], [1, 2, 3, 3, 4]])
    assert reorder(edge_index, "degsort", num_nodes=6).tolist() == [1, 3, 2, 0, 4, 5]


def test_connected_components_match_scipy():
    from fgplugin.reorder._graph import connected_components, symmetrize

    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        n = 400
        edge_index = torch.randint(0, n, (2, 150 + 60 * seed), generator=g)
        sym = symmetrize(edge_index[1], edge_index[0], n)
        ours = connected_components(sym.row, sym.col, n)
        count, theirs = scipy.sparse.csgraph.connected_components(sym.to_scipy(), directed=False)
        # scipy numbers components in order of their smallest id; ours names them by it.
        roots = torch.unique(ours)
        assert roots.numel() == count
        assert torch.equal(torch.searchsorted(roots, ours), torch.from_numpy(theirs).long())
        assert torch.equal(ours[roots], roots) and bool((ours <= torch.arange(n)).all())


def test_slashburn_hubs_then_giant_then_spokes():
    """Two stars joined through their hubs, a triangle and isolated nodes, with k=1: hub A
    (degree 8) goes first; star B is then the giant component; its hub follows, then the last
    giant node; the spokes found last come first among the spokes (B's leaves), then those of
    the first round: the triangle (largest component first), then single nodes by id."""
    edges = [(0, leaf) for leaf in range(1, 8)]           # star A: hub 0, leaves 1-7
    edges += [(10, leaf) for leaf in range(11, 16)]       # star B: hub 10, leaves 11-15
    edges += [(0, 10), (20, 21), (21, 22), (20, 22)]      # link + triangle; 8, 9, 16-19 isolated
    perm = reorder(torch.tensor(edges).t(), "slashburn", num_nodes=23, k=1).tolist()
    assert perm == [0, 10, 11, 12, 13, 14, 15, 20, 21, 22, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19]


@pytest.mark.parametrize("method, options", [("metis", {"cluster_size": 20}), ("community", {})])
def test_clusters_are_contiguous(method, options):
    perm = reorder(_two_cliques(20), method, num_nodes=40, **options)
    halves = perm.view(2, 20) % 2
    assert torch.equal(halves.min(1).values, halves.max(1).values)


def test_metis_workers_that_cannot_start_leave_the_clustering_to_this_process(monkeypatch):
    """A script without a ``__main__`` guard makes spawned workers fail (each runs the script
    again): the clusters are then made serially, with a warning naming the guard, and equal."""
    pytest.importorskip("pymetis", reason="the metis method needs pymetis")
    import importlib
    from concurrent.futures.process import BrokenProcessPool

    metis = importlib.import_module("fgplugin.reorder.metis")  # the module (the package exports the function)

    class Broken:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, *args, **kwargs):
            raise BrokenProcessPool("a child process terminated abruptly")

    edge_index, n = _planted(n=4000, size=100)
    serial = reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=4, workers=1)
    monkeypatch.setattr(metis, "ProcessPoolExecutor", Broken)
    with pytest.warns(RuntimeWarning, match="__main__"):
        fallen_back = reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=4, workers=2)
    assert torch.equal(fallen_back, serial)


def test_bad_csr_objects_perms_and_node_counts_are_refused():
    """Any object with rowptr, col and shape is checked as a CSR; tile_density's perm must be a
    permutation; num_nodes a whole number (a float was truncated)."""
    from types import SimpleNamespace

    csr = SimpleNamespace(rowptr=torch.tensor([0, 1, 2, 3]), col=torch.tensor([1, 5, 0]), shape=(3, 3))
    for method in ("degsort", "rcm", "community", "slashburn"):
        with pytest.raises(ValueError, match="col holds ids outside"):
            reorder(csr, method)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match="perm must be a permutation"):
        tile_density(edge_index, 3, torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="num_nodes must be a whole number"):
        reorder(edge_index, "degsort", num_nodes=3.7)
    assert torch.equal(torch.sort(reorder(edge_index, "degsort", num_nodes=np.int64(3))).values, torch.arange(3))


def test_metis_keeps_small_graphs_in_order():
    edge_index, n = _planted(n=150, size=50)
    assert torch.equal(reorder(edge_index, "metis", num_nodes=n), torch.arange(n))


def test_two_level_metis():
    """The two-level form (first-level parts, then clusters inside each, in worker processes)
    is a valid ordering, independent of the worker count, and as good on planted communities."""
    edge_index, n = _planted(n=4000, size=100)
    flat = reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=1)
    one = reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=4, workers=1)
    two = reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=4, workers=2)
    assert torch.equal(one, two)
    assert torch.equal(torch.sort(one).values, torch.arange(n))
    assert not torch.equal(one, flat)  # the two-level path really ran
    shares = [tile_density(edge_index, n, p)["dense_share"] for p in (flat, one)]
    # Measured: flat 0.81, two-level 0.80.
    assert shares[1] > 0.6 and shares[1] > shares[0] - 0.05
    with pytest.raises(ValueError, match="coarse_parts must be >= 1"):
        reorder(edge_index, "metis", num_nodes=n, cluster_size=100, coarse_parts=0)


def test_orderings_find_planted_communities():
    edge_index, n = _planted()
    share = {m: tile_density(edge_index, n, reorder(edge_index, m, num_nodes=n))["dense_share"]
             for m in ("none", "community", "metis")}
    # Measured: none 0.0, community 0.80, metis 0.78 (seeds 0-4 within 0.01).
    assert share["none"] < 0.05
    assert share["community"] > 0.6
    assert share["metis"] > 0.6
    before = tile_density(edge_index, n)
    after = tile_density(edge_index, n, reorder(edge_index, "rcm", num_nodes=n))
    assert after["bandwidth"] < before["bandwidth"]
    assert after["avg_bandwidth"] < 0.9 * before["avg_bandwidth"]


def test_community_order_groups_related_communities():
    """Communities that share many edges get neighbouring id ranges (the synthetic `small` graph:
    25% of edges go to the 15 other communities of a node's super-community)."""
    from fgplugin.datasets import community_graph

    g = community_graph("small", device="cpu", num_features=0)
    edge_index, n = g.edge_index, g.num_nodes
    near = {}
    for name, options in (("grouped", {}), ("ungrouped", {"group_size": None})):
        inv = torch.argsort(reorder(edge_index, "community", num_nodes=n, **options))
        near[name] = float(((inv[edge_index[0]] - inv[edge_index[1]]).abs() < 4096).float().mean())
    # Measured: grouped 0.886, ungrouped 0.720 (seed 0).
    assert near["grouped"] > 0.8 and near["grouped"] > near["ungrouped"] + 0.1


def test_group_communities_follows_the_heaviest_links():
    """Four triangles; 0-1 and 2-3 joined by all 9 node pairs, 1-2 by one edge; groups of <= 6
    nodes: {0, 1} and {2, 3}, whatever the seed (no two-cycles of synchronous updates)."""
    from fgplugin.reorder._graph import symmetrize
    from fgplugin.reorder.community import group_communities

    pairs = [(3 * c + a, 3 * c + b) for c in range(4) for a in range(3) for b in range(a + 1, 3)]
    pairs += [(3 * c + a, 3 * d + b) for c, d in ((0, 1), (2, 3)) for a in range(3) for b in range(3)]
    pairs.append((5, 6))
    row, col = torch.tensor(pairs).t()
    graph = symmetrize(row, col, 12)
    labels = torch.arange(12) // 3
    for seed in range(5):
        groups = group_communities(graph, labels, seed=seed, rounds=8, max_size=6)
        assert groups[0] == groups[1] and groups[2] == groups[3] and groups[1] != groups[2], (seed, groups)


def test_tile_density_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    n, tile = 20, 4
    loops = torch.tensor([[3, 3], [3, 3]])
    edge_index = torch.cat([torch.randint(0, n, (2, 60), generator=g), loops], 1)
    perm = torch.randperm(n, generator=g)
    dense = np.zeros((n, n), dtype=bool)
    inv = torch.argsort(perm).numpy()
    for src, dst in edge_index.t().tolist():
        dense[inv[dst], inv[src]] = True
    nnz, dense_nnz = dense.sum(), 0
    for i, j in itertools.product(range(0, n, tile), repeat=2):
        count = dense[i:i + tile, j:j + tile].sum()
        dense_nnz += count if count > 0.25 * tile * tile else 0
    rows, cols = np.nonzero(dense)
    got = tile_density(edge_index, n, perm, tile_size=tile, threshold=0.25)
    assert got["dense_share"] == pytest.approx(dense_nnz / nnz)
    assert got["bandwidth"] == np.abs(rows - cols).max()
    assert got["avg_bandwidth"] == pytest.approx(np.abs(rows - cols).mean())
    assert tile_density(torch.zeros(2, 0, dtype=torch.long), 5) == \
        {"dense_share": 0.0, "bandwidth": 0, "avg_bandwidth": 0.0}


def test_progress_bar_and_optional_tqdm(monkeypatch, capsys):
    edge_index, n = _planted(n=200, size=20)
    perm = reorder(edge_index, "community", num_nodes=n, parts=2)
    assert torch.equal(perm, reorder(edge_index, "community", num_nodes=n, parts=2, progress=True))
    assert "reorder[community-blockwise2]" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # tqdm not installed: no bar, same result
    assert torch.equal(perm, reorder(edge_index, "community", num_nodes=n, parts=2, progress=True))


def test_errors(monkeypatch):
    edge_index = torch.tensor([[0, 1], [1, 2]])
    expected = "unknown reorder method 'louvain'; expected one of none, degsort, slashburn"
    with pytest.raises(ValueError, match=expected):
        reorder(edge_index, "louvain", num_nodes=3)
    with pytest.raises(ValueError, match="group_size must be >= 1 or None"):
        reorder(edge_index, "community", num_nodes=3, group_size=0)
    for parts in (0, 4):
        with pytest.raises(ValueError, match=r"parts must be an int in \[1, num_nodes=3\]"):
            reorder(edge_index, "rcm", num_nodes=3, parts=parts)
    with pytest.raises(ValueError, match="square adjacency"):
        reorder(scipy.sparse.csr_matrix((3, 4)), "rcm")
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        reorder(torch.zeros(3, 4, dtype=torch.long), num_nodes=5)
    with pytest.raises(TypeError, match="must be int64"):
        reorder(edge_index.float(), num_nodes=3)
    with pytest.raises(ValueError, match=r"outside \[0, num_nodes=2\)"):
        reorder(edge_index, num_nodes=2)
    with pytest.raises(ValueError, match="outside"):
        reorder(-edge_index, num_nodes=3)
    with pytest.raises(ValueError, match="num_nodes is required"):
        reorder(edge_index)
    with pytest.raises(ValueError, match="does not match"):
        reorder(scipy.sparse.csr_matrix((3, 3)), num_nodes=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'cluster_size'"):
        reorder(edge_index, "community", num_nodes=3, cluster_size=10)
    with pytest.raises(TypeError, match="cannot reorder a list"):
        reorder([[0, 1], [1, 2]], num_nodes=3)
    monkeypatch.setitem(sys.modules, "pymetis", None)
    with pytest.raises(ImportError, match="pip install pymetis"):
        reorder(torch.randint(0, 500, (2, 2000)), "metis", num_nodes=500)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("method", METHODS)
def test_cuda(method):
    edge_index, n = _planted(n=600, size=60)
    perm = reorder(edge_index.cuda(), method, num_nodes=n, parts=2)
    assert perm.is_cuda
    _assert_permutation(perm, n)
    assert torch.equal(perm, reorder(edge_index.cuda(), method, num_nodes=n, parts=2))


def test_the_default_ordering_does_not_import_scipy():
    """scipy.sparse's import is most of a small graph's first reordering in a fresh process: only
    the orderings that run on scipy (rcm) or on its host CSR (metis) import it."""
    script = ("import sys, torch; from fgplugin.pyg import BlockReorder; from torch_geometric.data import Data; "
              "edge_index = torch.randint(0, 50, (2, 300)); "
              "BlockReorder()(Data(x=torch.randn(50, 4), edge_index=edge_index, num_nodes=50)); "
              "assert 'scipy.sparse' not in sys.modules, 'scipy.sparse was imported'; "
              "from fgplugin.reorder import reorder; reorder(edge_index, 'rcm', num_nodes=50); "
              "assert 'scipy.sparse' in sys.modules")
    pytest.importorskip("torch_geometric")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
