"""``SAGEConv`` whose mean aggregation runs on fgplugin's SpMM (other aggregations: stock)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.typing import Adj, OptPairTensor, Size

from fgplugin._csr import aux_dtype_for
from fgplugin.aggregation import aggregate, transform
from fgplugin.eager import eager_in_old_dynamo
from fgplugin.inference_mode import outside_inference_mode

from ._aggregation import MEAN
from ._layer import FgpluginLayer, check_sharded_call, fits, linear, make_aggregation


class SAGEConv(FgpluginLayer, pyg_conv.SAGEConv):
    r"""Drop-in :class:`torch_geometric.nn.SAGEConv`; with ``aggr="mean"`` (the default) the
    neighbourhood mean runs on fgplugin's SpMM, any other aggregation keeps the stock code.

    Same constructor, parameters, ``state_dict``, ``forward(x, edge_index, size=None)`` and
    results (within float rounding) as the stock layer, bipartite ``(x_src, x_dst)`` inputs and
    ``project=True`` included. The graph may also be a :class:`fgplugin.TiledAdjacency` (rows =
    target nodes); a weighted one, like a weighted ``torch.sparse`` ``adj_t``, gives the mean of
    the weighted messages, as the stock layer does for ``torch.sparse``.
    """

    _stock = pyg_conv.SAGEConv
    # PyG reads propagate()'s arguments from the class source, cached by class name, so a
    # same-named subclass must declare them.
    propagate_type = {"x": OptPairTensor}

    @eager_in_old_dynamo
    def forward(self, x: Tensor | OptPairTensor, edge_index: Adj, size: Size = None) -> Tensor:
        pair = (x, x) if isinstance(x, Tensor) else x
        aggregation = None
        if self.aggr == "mean" and isinstance(pair[0], Tensor) and pair[0].dim() >= 2 and self._fgplugin_serves():
            aggregation = self._aggregation(pair, edge_index, size)
        n_dst = None if aggregation is None else self._num_dst(pair, size)
        if not fits(aggregation, pair[0], self.node_dim, n_dst):
            self._refuse_misfit(aggregation, pair[0], edge_index)
            return self._stock_forward(x, edge_index, size)
        if self.project and hasattr(self, "lin"):
            pair = (self.lin(pair[0]).relu(), pair[1])
        parts = linear(self.lin_l)
        if parts is None:
            # a linear map of the user's (hooks, a wrapper) may write to its input in place: a copy
            out = self.lin_l(aggregate(aggregation, pair[0], owner=self, node_dim=self.node_dim, fresh=True))
        else:
            out = aggregate(aggregation, pair[0], weight=parts[0], bias=parts[1], owner=self, node_dim=self.node_dim)
        if self.root_weight and pair[1] is not None:
            root = linear(self.lin_r)
            out = out + (self.lin_r(pair[1]) if root is None else transform(pair[1], *root, owner=self))
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def _num_dst(self, pair, size: Size) -> int | None:
        """The number of target nodes, as the stock propagate() infers it; ``None`` where the
        inputs disagree (the stock layer then raises)."""
        n_src = pair[0].size(self.node_dim)
        n_dst = pair[1].size(self.node_dim) if isinstance(pair[1], Tensor) else None
        if size is not None:
            if size[0] != n_src or (n_dst is not None and size[1] != n_dst):
                return None
            n_dst = size[1]
        return n_src if n_dst is None else n_dst

    @outside_inference_mode
    def _aggregation(self, pair, edge_index, size: Size):
        n_src, n_dst = pair[0].size(self.node_dim), self._num_dst(pair, size)
        if n_dst is None:
            return None
        check_sharded_call(self, edge_index, pair[0], self.node_dim)
        # The stock mean ignores a SparseTensor's values but weighs torch.sparse messages.
        return make_aggregation(edge_index, None, n_src, n_dst, self.flow == "target_to_source", MEAN,
                                aux_dtype_for(pair[0].dtype), values_from=("torch.sparse",))
