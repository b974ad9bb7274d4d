# Written by the fgplugin project, not vendored: DGL's own tests/utils/__init__.py
# is not in the stored copy of dmlc/dgl these tests were taken from. It defines
# the one name that the vendored test_nn.py imports from `utils`, as DGL's does
# (all integer id types of the graph: int32 and int64).
import backend as F
import pytest

parametrize_idtype = pytest.mark.parametrize("idtype", [F.int32, F.int64])
