import dataclasses

import numpy as np
import pytest
import torch

from conftest import require_data_dir
from fgplugin.datasets import (
    ENV_VAR,
    SUITE,
    CommunityGraphParams,
    GraphData,
    community_graph,
    data_dir,
    list_npz,
    load_npz,
)
from fgplugin.datasets import npz as npz_module
from fgplugin.datasets import synthetic

# The real graphs expected in $FGPLUGIN_DATA_DIR: name -> (nodes, directed edges, features,
# feature format, classes, split sizes train/val/test or None).
README_GRAPHS = {
    "citeseer": (3327, 9104, 3703, "dense", 6, (120, 500, 1000)),
    "cora": (2708, 10556, 1433, "dense", 7, (140, 500, 1000)),
    "cora_ml": (2995, 16316, 2879, "dense", 7, None),
    "actor": (7600, 53318, 932, "dense", 5, (3648, 2432, 1520)),
    "chameleon": (2277, 62742, 2325, "dense", 5, (1092, 729, 456)),
    "pubmed_nofeat": (19717, 88648, None, None, 3, (60, 500, 1000)),
    "coauthor_cs": (18333, 163788, 6805, "csr", 15, None),
    "amazon_photo": (7650, 238162, 745, "dense", 8, None),
    "twitch_de": (9498, 306276, 3170, "dense", 2, None),
    "facebook_pagepage": (22470, 341646, 4714, "csr", 4, None),
    "squirrel": (5201, 396706, 2089, "dense", 5, (2496, 1664, 1041)),
    "snap_slashdot0902": (82168, 1008460, None, None, None, None),
    "tolokers": (11758, 1038000, 10, "dense", 2, (5879, 2939, 2940)),
    "cornell5": (18660, 1581554, 4735, "csr", 2, None),
    "oklahoma97": (17425, 1785056, 2309, "dense", 2, None),
    "snap_ego_twitter": (81306, 2684592, None, None, None, None),
}

# docs/benchmarks.md, the synthetic graph suite: name -> (nodes, directed edges, features, classes).
BENCHMARK_SUITE = {
    "reddit-like": (232_965, 110_000_000, 602, 41),
    "proteins-like": (132_534, 75_000_000, 602, 8),
    "products-like": (2_449_029, 120_000_000, 100, 47),
    "archaea-like": (1_644_228, 200_000_000, 602, 10),
}


def assert_simple_symmetric_sorted(edge_index: torch.Tensor, n: int):
    """Sorted by (source, target) without duplicates, in range, no self loops, symmetric."""
    assert edge_index.dtype == torch.int64 and edge_index.dim() == 2 and edge_index.shape[0] == 2
    src, dst = edge_index
    assert int(edge_index.min()) >= 0 and int(edge_index.max()) < n
    assert not bool((src == dst).any())
    key = src * n + dst
    assert bool((key[1:] > key[:-1]).all()), "not strictly sorted: unsorted or duplicate pairs"
    assert torch.equal(torch.sort(dst * n + src).values, key), "not symmetric"


# ---------------------------------------------------------------------------- synthetic graphs


@pytest.fixture(scope="module")
def small():
    return community_graph("small", seed=0)


@pytest.fixture(scope="module")
def tiny():
    return community_graph("tiny", seed=0)


def test_suite_matches_benchmarks_table():
    assert {"tiny", "small", *BENCHMARK_SUITE} == set(SUITE)
    for name, (nodes, edges, feats, classes) in BENCHMARK_SUITE.items():
        p = SUITE[name]
        assert (p.num_nodes, p.num_features, p.num_classes) == (nodes, feats, classes)
        assert p.target_edges == edges
        assert abs(p.p_in + p.p_near + p.p_far - 1) < 1e-9 and p.super_size == 16


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_structure(name, request):
    g = request.getfixturevalue(name)
    p = SUITE[name]
    assert isinstance(g, GraphData) and g.name == name and g.num_nodes == p.num_nodes
    assert_simple_symmetric_sorted(g.edge_index, g.num_nodes)
    assert abs(g.num_edges - p.target_edges) <= 0.1 * p.target_edges
    assert g.meta["target_edges"] == p.target_edges and g.meta["params"]["p_in"] == p.p_in


def test_edge_count_is_close_for_any_seed():
    for seed in range(3):
        g = community_graph("tiny", seed=seed)
        assert abs(g.num_edges - SUITE["tiny"].target_edges) <= 0.1 * SUITE["tiny"].target_edges


def test_labels_features_masks(small):
    g, p = small, SUITE["small"]
    n = g.num_nodes
    assert g.y.dtype == torch.int64 and g.y.shape == (n,)
    assert g.num_classes == p.num_classes
    assert torch.equal(torch.unique(g.y), torch.arange(p.num_classes))
    assert g.x.dtype == torch.float32 and g.x.shape == (n, p.num_features)
    assert bool(torch.isfinite(g.x).all())
    masks = torch.stack([g.train_mask, g.val_mask, g.test_mask])
    assert masks.dtype == torch.bool and int(masks.sum(0).max()) == 1, "masks overlap"
    assert masks.sum(1).tolist() == [round(f * n) for f in (p.train_frac, p.val_frac, p.test_frac)]
    # Labels follow communities: one class per community.
    pairs = torch.unique(g.community * p.num_classes + g.y)
    assert pairs.numel() == g.meta["num_communities"]


def test_community_structure_and_power_law(small):
    g = small
    src, dst = g.edge_index
    intra = (g.community[src] == g.community[dst]).float().mean().item()
    assert 0.45 < intra < 0.7, f"share of intra-community edges {intra:.2f}, model says ~0.6"
    deg = torch.bincount(src, minlength=g.num_nodes).float()
    assert deg.max() > 10 * deg.mean(), "no hubs: degrees are not heavy-tailed"
    assert deg.max() <= SUITE["small"].max_degree * 1.2


def test_features_need_the_graph(small):
    # Nearest class mean (fit on train nodes): own features alone are a weak signal; summing over
    # neighbours (what one GCN layer does) makes it much stronger.
    g = small

    def accuracy(feat):
        tr, te = g.train_mask, g.test_mask
        mu = torch.zeros(g.num_classes, feat.shape[1]).index_add_(0, g.y[tr], feat[tr])
        mu /= torch.bincount(g.y[tr], minlength=g.num_classes)[:, None]
        return (torch.cdist(feat[te], mu).argmin(1) == g.y[te]).float().mean().item()

    src, dst = g.edge_index
    own, aggregated = accuracy(g.x), accuracy(g.x.index_add(0, dst, g.x[src]))
    assert own < 0.6 and aggregated > own + 0.2, (own, aggregated)


def test_node_ids_are_permuted(small):
    c = small.community
    same_as_next = (c[1:] == c[:-1]).float().mean().item()
    assert same_as_next < 0.05, "consecutive ids share communities: the permutation was not applied"
    # The ideal order (sort by community) does group them, so the structure is there to find.
    ideal = torch.sort(c).values
    assert (ideal[1:] == ideal[:-1]).float().mean().item() > 0.95


def test_deterministic(tiny):
    again = community_graph("tiny", seed=0)
    for f in dataclasses.fields(GraphData):
        a, b = getattr(tiny, f.name), getattr(again, f.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name
    other = community_graph("tiny", seed=1)
    assert other.num_edges != tiny.num_edges or not torch.equal(other.edge_index, tiny.edge_index)
    assert not torch.equal(other.community, tiny.community)


def test_overrides():
    g = community_graph("tiny", num_nodes=1000, avg_degree=8.0, num_features=0, num_classes=3)
    assert g.num_nodes == 1000 and g.x is None and g.num_classes == 3
    assert abs(g.num_edges - 8000) <= 800
    assert_simple_symmetric_sorted(g.edge_index, 1000)
    assert g.meta["params"]["num_nodes"] == 1000


def test_dense_regime_of_big_presets_scaled_down():
    # proteins-like's degree (~566) on 3000 nodes in communities of 700-1500 (~40% dense inside,
    # denser than the full preset): hubs saturate their communities, so the top-up rounds must work.
    g = community_graph(
        "proteins-like", num_nodes=3000, community_size=(700, 1500), num_classes=2, num_features=0
    )
    target = round(3000 * SUITE["proteins-like"].avg_degree)
    assert abs(g.num_edges - target) <= 0.1 * target and g.meta["rounds"] >= 2
    assert_simple_symmetric_sorted(g.edge_index, 3000)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown community_graph preset"):
        community_graph("cora-like")
    with pytest.raises(TypeError, match="unknown override"):
        community_graph("tiny", num_edges=5)
    with pytest.raises(ValueError, match="p_in"):
        community_graph("tiny", p_in=0.9)
    with pytest.raises(ValueError, match="communities cannot carry"):
        community_graph("tiny", num_classes=500)
    with pytest.raises(ValueError, match="too dense"):
        # 180 in-community neighbours wanted, communities hold at most 100 nodes.
        community_graph("tiny", num_nodes=400, avg_degree=300.0, num_classes=2, max_rounds=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SUITE["tiny"].num_nodes = 5
    for override, message in ((dict(num_classes=0), "num_classes must be an int >= 1"),
                              (dict(super_size=0), "super_size must be an int >= 1"),
                              (dict(num_nodes=2000.5), "num_nodes must be an int >= 1"),
                              (dict(p_in=-0.2, p_near=0.6, p_far=0.6), r"p_in must lie in \[0, 1\]"),
                              (dict(test_frac=-0.5), r"test_frac must lie in \[0, 1\]")):
        with pytest.raises(ValueError, match=message):
            community_graph("tiny", **override)


def test_graphdata_to_and_repr(tiny):
    moved = tiny.to("cpu")
    assert moved is not tiny and moved.edge_index is tiny.edge_index and moved.meta is tiny.meta
    text = repr(tiny)
    assert "tiny" in text and f"num_nodes={tiny.num_nodes:,}" in text
    assert f"num_edges={tiny.num_edges:,}" in text and "x=[2000, 32]" in text


def test_presets_are_documented():
    for name, p in SUITE.items():
        assert isinstance(p, CommunityGraphParams)
        assert name in synthetic.__doc__ and f"{p.num_nodes:,}" in synthetic.__doc__


# ---------------------------------------------------------------------------- real graphs


@pytest.mark.parametrize("name", sorted(README_GRAPHS))
def test_load_every_readme_graph(name):
    require_data_dir()
    nodes, edges, feats, fmt, classes, split = README_GRAPHS[name]
    g = load_npz(name)
    assert g.name == name and g.num_nodes == nodes and g.num_edges == edges
    assert_simple_symmetric_sorted(g.edge_index, nodes)
    assert g.meta["undirected"] is True
    assert g.meta["source"] and all(isinstance(line, str) for line in g.meta["source"])
    if fmt is None:
        assert g.x is None
    else:
        assert g.x.dtype == torch.float32 and tuple(g.x.shape) == (nodes, feats)
        assert (g.x.layout == torch.sparse_csr) == (fmt == "csr")
    if classes is None:
        assert g.y is None and g.num_classes is None
    else:
        assert g.y.dtype == torch.int64 and g.y.shape == (nodes,) and g.num_classes == classes
        assert int(g.y.min()) >= -1
    masks = (g.train_mask, g.val_mask, g.test_mask)
    if split is None:
        assert all(m is None for m in masks)
    else:
        assert tuple(int(m.sum()) for m in masks) == split
        assert all(m.dtype == torch.bool for m in masks)
        assert int(torch.stack(masks).sum(0).max()) == 1
        assert not bool((torch.stack(masks).any(0) & (g.y < 0)).any())


def test_every_file_is_known():
    folder = require_data_dir()
    assert set(README_GRAPHS) <= set(list_npz()) and list_npz(folder) == list_npz()


def test_feature_modes():
    require_data_dir()
    csr = load_npz("coauthor_cs", features="sparse")
    assert csr.x.layout == torch.sparse_csr and csr.x.values().dtype == torch.float32
    dense = load_npz("coauthor_cs", features="dense")
    assert dense.x.layout == torch.strided and dense.x.dtype == torch.float32
    # Same matrix, checked without a second 500 MB dense copy.
    assert int(torch.count_nonzero(dense.x)) == csr.x.values().numel()
    crow, col, val = csr.x.crow_indices(), csr.x.col_indices(), csr.x.values()
    for row in (0, 1, 9000, 18332):
        lo, hi = int(crow[row]), int(crow[row + 1])
        assert torch.equal(dense.x[row, col[lo:hi]], val[lo:hi])
    cora = load_npz("cora", features="sparse")  # stored dense: stays dense
    assert cora.x.layout == torch.strided and cora.x.shape == (2708, 1433)
    assert load_npz("cora", features=None).x is None
    with pytest.raises(ValueError, match="features must be one of"):
        load_npz("cora", features="csr")


def test_path_and_root(tmp_path):
    folder = require_data_dir()
    by_path = load_npz(folder / "cora.npz")
    by_root = load_npz("cora.npz", root=folder)
    assert torch.equal(by_path.edge_index, by_root.edge_index)
    assert by_path.meta["path"] == str(folder / "cora.npz")


def test_bad_names_and_paths(tmp_path, monkeypatch):
    folder = require_data_dir()
    with pytest.raises(FileNotFoundError, match="no such graph file"):
        load_npz(tmp_path / "missing.npz")
    with pytest.raises(FileNotFoundError, match="available: .*cora"):
        load_npz("coraa", root=folder)


def test_bare_name_needs_a_folder(monkeypatch, tmp_path):
    # No search of the filesystem: without root= or $FGPLUGIN_DATA_DIR a bare name is an error
    # saying what to set, whatever lies around the working directory.
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert data_dir() is None and list_npz() == []
    with pytest.raises(FileNotFoundError, match=rf"set {ENV_VAR} to the folder holding the \.npz files or pass "
                                                r"root= / a path"):
        load_npz("cora")


def test_bad_files(tmp_path):
    partial = tmp_path / "partial.npz"
    np.savez(partial, edge_index=np.zeros((2, 0), dtype=np.int64))
    with pytest.raises(ValueError, match=r"partial\.npz: missing key\(s\) \['num_nodes'.*fgplugin\.datasets\.npz"):
        load_npz(partial)
    text = tmp_path / "text.npz"
    text.write_text("not an archive")
    with pytest.raises(ValueError, match=r"text\.npz is not a readable \.npz.*schema in the docstring of "
                                         r"fgplugin\.datasets\.npz"):
        load_npz(text)
    bad_ids = tmp_path / "bad_ids.npz"
    np.savez(
        bad_ids,
        edge_index=np.array([[0], [5]], dtype=np.int64),
        num_nodes=np.int64(3),
        undirected=np.bool_(False),
        source=np.array(["test"]),
    )
    with pytest.raises(ValueError, match="outside"):
        load_npz(bad_ids)


def _minimal(n=3, **arrays):
    return dict(edge_index=np.array([[0, 1], [1, 0]], dtype=np.int64), num_nodes=np.int64(n),
                undirected=np.bool_(True), source=np.array(["test"]), **arrays)


@pytest.mark.parametrize("field, value, message", [
    ("train_mask", np.array([1, 0, 1]), "train_mask must be bool"),  # would index rows 0 and 1
    ("num_nodes", np.float64(3.9), "num_nodes must be a non-negative int64 0-d"),
    ("num_nodes", np.array([3]), "num_nodes must be a non-negative int64 0-d"),
    ("undirected", np.array("no"), "undirected must be a bool 0-d"),
    ("y", np.array([0, -7, 1]), "y must be int64 .N. of class indices .* down to -7"),
    ("y", np.zeros((3, 2)), "y must be int64"),
    ("x", np.zeros(3, dtype=np.float32), r"x must be float \[N, F\]"),
    ("x", np.zeros((3, 2), dtype=">f4"), "big-endian"),
    ("x_shape", np.array([3, 2, 1]), r"x_shape must be int64 \[2\]"),
    ("x_indptr", np.array([0, 1, 1, 2], dtype=np.int32), "must be int64 x_indptr"),
    ("x_indices", np.array([0, 5]), "fail torch's checks"),  # a column id past F = 2
], ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None)
def test_malformed_fields_are_refused_naming_the_file(tmp_path, field, value, message):
    """Every field is checked against the schema before anything uses it: a 0/1 integer mask, for
    one, would load and select the wrong training nodes."""
    csr = dict(x_indptr=np.array([0, 1, 1, 2]), x_indices=np.array([0, 1]), x_data=np.ones(2, np.float32),
               x_shape=np.array([3, 2]))
    arrays = _minimal(**(csr if field.startswith("x_") else {}))
    arrays[field] = value
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"bad\.npz: .*" + message):
        load_npz(path)


def test_empty_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.npz is not a readable \.npz"):
        load_npz(empty)
    np.savez(tmp_path / "none.npz", **_minimal(0, y=np.zeros(0, np.int64)) | {"edge_index": np.zeros((2, 0), np.int64)})
    assert load_npz(tmp_path / "none.npz").num_classes is None


def test_schema_is_documented():
    doc = npz_module.__doc__
    for key in ("edge_index", "num_nodes", "undirected", "source", "x", "x_indptr", "x_indices", "x_data",
                "x_shape", "y", "train_mask", "val_mask", "test_mask"):
        assert f"``{key}``" in doc, key
    for fact in ("int64", "float32", "sorted by (source,", "no self loops", "both directions", "``-1`` = unlabelled"):
        assert fact in " ".join(doc.split()), fact


def test_minimal_file_loads(tmp_path):
    path = tmp_path / "mini.npz"
    np.savez(
        path,
        edge_index=np.array([[0, 1], [1, 0]], dtype=np.int64),
        num_nodes=np.int64(3),
        undirected=np.bool_(True),
        source=np.array(["name: mini"]),
    )
    g = load_npz("mini", root=tmp_path)
    assert g.num_nodes == 3 and g.x is None and g.y is None and g.meta["source"] == ["name: mini"]
    assert list_npz(tmp_path) == ["mini"]


def test_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert data_dir() == tmp_path
    assert list_npz() == []
    (tmp_path / "g.npz").write_bytes(b"")
    assert list_npz() == ["g"]
    monkeypatch.setenv(ENV_VAR, "")
    assert data_dir() is None
    monkeypatch.delenv(ENV_VAR)
    assert data_dir() is None and list_npz() == []


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
@pytest.mark.parametrize("setting", ["unset", "missing", "empty"])
def test_require_data_dir_without_data(tmp_path, monkeypatch, ci, outcome, setting):
    if setting == "unset":
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere" if setting == "missing" else tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=ENV_VAR):
        require_data_dir()


def test_require_data_dir_with_data(tmp_path, monkeypatch):
    np.savez(tmp_path / "g.npz", num_nodes=np.int64(1))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.setenv("CI", "true")
    assert require_data_dir() == tmp_path
