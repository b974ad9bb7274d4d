"""Reordering end to end: model outputs are invariant, the disk cache is atomic and checked."""
import warnings

import pytest
import torch

import fgplugin
from fgplugin.cache import CacheWarning, cached, load_entry, save_entry
from fgplugin.preprocess import reorder_graph
from fgplugin.reorder import METHODS
from fgplugin.testing import rel_error


def _community_graph(n=300, community=30, num_edges=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (num_edges,), generator=g)
    same = torch.rand(num_edges, generator=g) < 0.8
    dst = torch.where(same, (src // community) * community + torch.randint(0, community, (num_edges,), generator=g),
                      torch.randint(0, n, (num_edges,), generator=g))
    ids = torch.randperm(n, generator=g)  # hide the communities behind random ids
    ei = ids[torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])]
    return ei, n


def _gcn(adj, x, w1, w2):
    norm = adj.norm("gcn")
    h = torch.relu(fgplugin.spmm(adj, x @ w1, *norm))
    return fgplugin.spmm(adj, h @ w2, *norm)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_model_output_invariant_under_reordering(method, parts):
    edge_index, n = _community_graph()
    g = torch.Generator().manual_seed(1)
    x, w1, w2 = torch.randn(n, 16, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, 4, generator=g)
    weight = torch.rand(edge_index.shape[1], generator=g) + 0.5
    original = fgplugin.TiledAdjacency.from_edge_index(edge_index, n, weight)
    reordered = reorder_graph(edge_index, n, weight, method=method, parts=parts)
    assert sorted(reordered.perm.tolist()) == list(range(n))
    out = _gcn(reordered, x[reordered.perm], w1, w2)
    assert rel_error(out[reordered.inv_perm], _gcn(original, x, w1, w2)) <= 1e-5


def test_reordering_creates_dense_tiles():
    edge_index, n = _community_graph(n=2048, community=64, num_edges=20000)
    before = fgplugin.TiledAdjacency.from_edge_index(edge_index, n)
    after = reorder_graph(edge_index, n, method="community")
    assert after.dense_share > before.dense_share + 0.3, (before.dense_share, after.dense_share)


def test_disk_cache_roundtrip_and_second_load(tmp_path):
    edge_index, n = _community_graph()
    first = reorder_graph(edge_index, n, method="community", cache=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 1 and not list(tmp_path.glob("*.tmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = reorder_graph(edge_index, n, method="community", cache=tmp_path)
    assert torch.equal(first.perm, second.perm) and torch.equal(first.col, second.col)
    reorder_graph(edge_index, n, method="degsort", cache=tmp_path)  # other options: another entry
    assert len(list(tmp_path.glob("*.pt"))) == 2


def test_the_edge_order_kept_has_its_own_cache_entry(tmp_path):
    """An entry built without the edge order cannot serve a call that keeps it (per-edge values
    given later would find no edges), and the key without it is the one entries had before."""
    from fgplugin.preprocess import cache_key

    edge_index, n = _community_graph()
    reorder_graph(edge_index, n, method="degsort", cache=tmp_path)
    kept = reorder_graph(edge_index, n, method="degsort", cache=tmp_path, keep_edge_order=True)
    assert len(list(tmp_path.glob("*.pt"))) == 2 and kept.edge_perm is not None
    weights = torch.rand(edge_index.shape[1], dtype=torch.float64)
    dense = torch.zeros(n, n, dtype=torch.float64)
    new_ids = kept.inv_perm[edge_index]
    dense.index_put_((new_ids[1], new_ids[0]), weights, accumulate=True)  # rows: destinations
    x = torch.randn(n, 3, dtype=torch.float64)
    assert torch.allclose(fgplugin.spmm(kept.with_values(weights), x), dense @ x)
    assert cache_key(edge_index, n) == cache_key(edge_index, n, keep_edge_order=False) \
        != cache_key(edge_index, n, keep_edge_order=True)


def test_method_options_reach_the_ordering_and_the_cache_key(tmp_path):
    """``method_options`` go to fgplugin.reorder.reorder (here slashburn's ``k``) and key their
    own cache entry; without them the key is the one entries were written under before."""
    from fgplugin.preprocess import cache_key
    from fgplugin.reorder import reorder

    edge_index, n = _community_graph()
    for k in (1, 40):
        adj = reorder_graph(edge_index, n, method="slashburn", method_options=dict(k=k), cache=tmp_path)
        assert torch.equal(adj.perm, reorder(edge_index, "slashburn", num_nodes=n, k=k))
    assert len(list(tmp_path.glob("*.pt"))) == 2
    assert not torch.equal(reorder(edge_index, "slashburn", num_nodes=n, k=1),
                           reorder(edge_index, "slashburn", num_nodes=n, k=40))
    assert cache_key(edge_index, n) == cache_key(edge_index, n, method_options={}) \
        != cache_key(edge_index, n, method_options=dict(k=1))
    with pytest.raises(TypeError, match="method_options must be a dict"):
        reorder_graph(edge_index, n, method_options=[("k", 1)])


def test_the_transforms_pass_method_options():
    pytest.importorskip("torch_geometric", reason="the PyG transform needs torch_geometric")
    from torch_geometric.data import Data

    import fgplugin.pyg as fp
    from fgplugin.reorder import reorder

    edge_index, n = _community_graph()
    out = fp.BlockReorder(method="slashburn", method_options=dict(k=1))(Data(edge_index=edge_index, num_nodes=n))
    assert torch.equal(out.perm, reorder(edge_index, "slashburn", num_nodes=n, k=1))
    assert "method_options={'k': 1}" in repr(fp.BlockReorder(method="slashburn", method_options=dict(k=1)))


@pytest.mark.parametrize("damage", ["flip", "truncate", "stale"])
def test_corrupt_or_stale_cache_entry_is_reported_and_rebuilt(tmp_path, damage):
    path = tmp_path / "entry.pt"
    save_entry(path, "key-1", {"value": torch.arange(100)})
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-10] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif damage == "truncate":
        path.write_bytes(bytes(raw[:-7]))
    key = "key-2" if damage == "stale" else "key-1"
    with pytest.warns(CacheWarning, match="stale" if damage == "stale" else "corrupt"):
        value = cached(path, key, lambda: {"value": torch.arange(5)})
    assert value["value"].tolist() == list(range(5))
    assert load_entry(path, key)["value"].tolist() == list(range(5))  # rebuilt entry is valid


def test_failed_write_leaves_no_partial_entry(tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(Exception):
        save_entry(tmp_path / "entry.pt", "k", Unpicklable())
    assert list(tmp_path.iterdir()) == []


def test_unloadable_or_foreign_entries_are_reported_and_rebuilt(tmp_path):
    path = tmp_path / "entry.pt"
    save_entry(path, "key-1", {"value": torch.arange(3)})
    header, payload = path.read_bytes().split(b"\n", 1)
    payload = b"not a torch file" + payload[16:]  # a payload that passes its checksum but does not load
    import hashlib
    fields = header.split(b" ")
    fields[2], fields[3] = hashlib.sha256(payload).hexdigest().encode(), str(len(payload)).encode()
    path.write_bytes(b" ".join(fields) + b"\n" + payload)
    with pytest.warns(CacheWarning, match="unloadable"):
        assert cached(path, "key-1", lambda: {"value": torch.arange(5)})["value"].numel() == 5
    assert load_entry(path, "key-1")["value"].numel() == 5
    path.write_bytes(b"garbage without a header")
    with pytest.warns(CacheWarning, match="no fgplugin cache header"):
        assert load_entry(path, "key-1") is None


def test_a_killed_writes_temporary_file_is_removed_once_old(tmp_path):
    import os
    import time
    old, fresh = tmp_path / "a.ptxyz.tmp", tmp_path / "b.ptxyz.tmp"
    for f in (old, fresh):
        f.write_bytes(b"partial")
    stamp = time.time() - 2 * 3600
    os.utime(old, (stamp, stamp))
    save_entry(tmp_path / "c.pt", "k", torch.arange(2))
    assert not old.exists() and fresh.exists()  # a fresh one may be another process's write in progress
