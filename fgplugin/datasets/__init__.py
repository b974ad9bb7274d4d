"""Graphs for tests and benchmarks: real ``.npz`` graphs (from ``$FGPLUGIN_DATA_DIR`` or a given
folder or path; schema in :mod:`fgplugin.datasets.npz`) and seeded synthetic ones."""
from .graph import GraphData
from .npz import ENV_VAR, data_dir, list_npz, load_npz
from .synthetic import SUITE, CommunityGraphParams, community_graph

__all__ = [
    "GraphData",
    "community_graph",
    "CommunityGraphParams",
    "SUITE",
    "load_npz",
    "list_npz",
    "data_dir",
    "ENV_VAR",
]
