"""Graphs for tests and benchmarks: the shared real ``.npz`` graphs and seeded synthetic ones."""
from .graph import GraphData
from .npz import ENV_VAR, list_npz, load_npz, require_shared_data, shared_data_dir
from .synthetic import SUITE, CommunityGraphParams, community_graph

__all__ = [
    "GraphData",
    "community_graph",
    "CommunityGraphParams",
    "SUITE",
    "load_npz",
    "list_npz",
    "shared_data_dir",
    "require_shared_data",
    "ENV_VAR",
]
