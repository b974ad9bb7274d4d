// The contents of a CSR that the kernels index with, checked before any kernel reads them: rowptr
// starts at 0, never decreases and ends at col's length, and every column id is >= 0. The largest
// column id is kept too and compared with the feature rows of every call. The check reads both
// arrays (on CUDA: a few reductions and one copy to the host), once per version of the two
// tensors (checked_contents.h).
#include "checked_contents.h"
#include "common.h"

namespace fgplugin {

int64_t checked_max_col(const at::Tensor& rowptr, const at::Tensor& col, const char* op) {
  static CheckedContents checked;
  if (const auto kept = checked.find({rowptr, col})) return *kept;
  const int64_t n_rows = rowptr.numel() - 1, nnz = col.numel();
  // first and last entry of rowptr, its smallest step, the range of col: one copy to the host
  const at::Tensor stats = at::cat({rowptr.slice(0, 0, 1).to(at::kLong), rowptr.slice(0, n_rows).to(at::kLong),
                                    smallest_step(rowptr), min_max(col)}).cpu();
  const int64_t* s = stats.data_ptr<int64_t>();
  TORCH_CHECK(s[0] == 0 && s[1] == nnz && s[2] >= 0,
              std::string(op) + ": rowptr is not a row pointer of col: it must start at 0, never decrease and end at "
              "col's length (" + num(nnz) + "); it starts at " + num(s[0]) + ", ends at " + num(s[1]) +
              (s[2] < 0 ? " and decreases somewhere" : "") +
              ". Rebuild the adjacency (TiledAdjacency.from_edge_index or from_csr check their inputs)");
  TORCH_CHECK(nnz == 0 || s[3] >= 0, std::string(op) + ": col holds a negative node id (" + num(s[3]) +
                                         "); rebuild the adjacency from valid node ids");
  checked.remember({rowptr, col}, s[4]);
  return s[4];
}

}  // namespace fgplugin
