"""Graphs for tests and benchmarks: real ``.npz`` graphs (from ``$FGPLUGIN_DATA_DIR`` or a given
folder or path; schema in :mod:`fgplugin.datasets.npz`) and seeded synthetic ones."""
from .graph import GraphData
from .npz import ENV_VAR, data_dir, list_npz, load_npz
from .synthetic import SUITE, CommunityGraphParams, community_graph


def load_graph(name: str, device=None, seed: int = 0) -> GraphData:
    """A graph by name: a synthetic preset of :data:`SUITE` (generated with ``seed`` on
    ``device``), else a real ``.npz`` graph (a name in ``$FGPLUGIN_DATA_DIR`` or a path) with dense
    features, on the CPU."""
    if name in SUITE:
        return community_graph(name, seed=seed, device=device)
    return load_npz(name, features="dense")


__all__ = [
    "GraphData",
    "community_graph",
    "load_graph",
    "CommunityGraphParams",
    "SUITE",
    "load_npz",
    "list_npz",
    "data_dir",
    "ENV_VAR",
]
