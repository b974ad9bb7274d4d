// Checks of the block-adaptive kernel plan (buffer + layout, format in block_adaptive_spmm.cuh)
// against the op's arguments, kept out of the .cu files so that errors are thrown from C++ frames
// only. The layout is checked on every call (host values only); the contents, which index the
// kernels' reads and writes, once per version of the buffer (checked_contents.h): every index a
// kernel follows must be in range, so that a plan of another graph or a damaged one is refused
// instead of read out of bounds.
#include <vector>

#include "../checked_contents.h"
#include "block_adaptive_spmm.cuh"

namespace fgplugin {
namespace {

const char* const kSectionNames[kPlanSections] = {
    "dblock_ptr", "dwork", "dstage", "dtile_bits", "dtile_roff", "dense_eid", "rem_col", "rem_eid",
    "item_ptr", "item_row", "item_slot", "split_row", "split_ptr", "slot_row", "dtile_frag", "dpanel_dense"};

// Expected dtype of each section; the index sections take the adjacency's (int32 or int64).
at::ScalarType section_dtype(int s, at::ScalarType index) {
  switch (s) {
    case 4: case 5: case 11:
      return at::kLong;
    case 6: case 7: case 8: case 9:
      return index;
    default:
      return at::kInt;
  }
}

}  // namespace

void check_block_plan(const SpmmArgs& a, const at::Tensor& buffer, at::IntArrayRef layout) {
  const std::string rebuild = "; rebuild it with the installed fgplugin (fgplugin.spmm does this for you)";
  TORCH_CHECK(layout.size() == static_cast<size_t>(kPlanHeader + 3 * kPlanSections) && layout[0] == kPlanVersion &&
                  layout[3] == kPlanSections,
              "fgplugin.spmm: the kernel plan's layout has " + num(static_cast<int64_t>(layout.size())) +
                  " entries and version " + num(layout.empty() ? -1 : layout[0]) + ", expected " +
                  num(kPlanHeader + 3 * kPlanSections) + " entries of plan format " + num(kPlanVersion) + rebuild);
  TORCH_CHECK(buffer.scalar_type() == at::kByte && buffer.dim() == 1 && buffer.is_contiguous() &&
                  buffer.device() == a.x.device(),
              "fgplugin.spmm: the kernel plan must be a contiguous 1-D uint8 buffer on ", a.x.device(), ", got ",
              buffer.scalar_type(), " of shape ", dims(buffer.sizes()), " on ", buffer.device());
  TORCH_CHECK(a.x.scalar_type() == at::kFloat || a.x.scalar_type() == at::kHalf || a.x.scalar_type() == at::kBFloat16,
              "fgplugin.spmm: the block-adaptive kernel takes float, half or bfloat16 x, got ", a.x.scalar_type());
  TORCH_CHECK(a.x.size(1) <= block_adaptive_max_features(a.x.scalar_type()), "fgplugin.spmm: F=", num(a.x.size(1)),
              " is too wide for the block-adaptive kernel; split the features into chunks of at most ",
              num(block_adaptive_max_features(a.x.scalar_type())));
  const int64_t bytes = buffer.numel();
  int64_t numel[kPlanSections];
  for (int s = 0; s < kPlanSections; ++s) {
    const int64_t offset = layout[kPlanHeader + 3 * s], n = layout[kPlanHeader + 3 * s + 1];
    const int64_t code = layout[kPlanHeader + 3 * s + 2];
    const at::ScalarType expected = section_dtype(s, a.rowptr.scalar_type());
    TORCH_CHECK(code == static_cast<int64_t>(expected),
                std::string("fgplugin.spmm: kernel plan section ") + kSectionNames[s] + " has dtype code " + num(code) +
                    ", expected " + num(static_cast<int64_t>(expected)) + " (" + c10::toString(expected) + ")" +
                    rebuild);
    const int64_t size = static_cast<int64_t>(c10::elementSize(expected));
    TORCH_CHECK(offset >= 0 && offset % 16 == 0 && n >= 0 && n <= (bytes - offset) / size && offset <= bytes,
                std::string("fgplugin.spmm: kernel plan section ") + kSectionNames[s] + " (offset " + num(offset) +
                    ", " + num(n) + " entries) does not fit the plan's " + num(bytes) + " bytes" + rebuild);
    numel[s] = n;
  }
  const int64_t n_rows = a.n_rows, n_items = numel[9], n_split = numel[11];
  const int64_t n_panels = (n_rows + 31) / 32;
  TORCH_CHECK(numel[0] == (n_panels + kBlockPanels - 1) / kBlockPanels + 1 && numel[15] == n_panels &&
                  numel[8] == n_items + 1 && numel[10] == n_items && n_items >= n_rows && numel[2] % 4 == 0 &&
                  numel[14] == numel[3] && numel[3] % 32 == 0 && numel[12] == n_split + 1 &&
                  numel[6] <= a.col.numel(),
              "fgplugin.spmm: the kernel plan does not match this adjacency (" + num(n_rows) + " rows, " +
                  num(a.col.numel()) + " non-zeros)" + rebuild);
  if (a.values.has_value()) {
    TORCH_CHECK(layout[1] == 1 && numel[7] == numel[6] && numel[4] == numel[3],
                "fgplugin.spmm: this kernel plan was built for unit weights but edge values were given; "
                "build it with weighted=True (fgplugin.spmm does this for you)");
  }
  const int64_t max_col = checked_plan_max_col(a, buffer, layout);
  TORCH_CHECK(max_col < a.x.size(0), "fgplugin.spmm: the kernel plan refers to source node " + num(max_col) +
                                         " but x has " + num(a.x.size(0)) + " rows; it belongs to another graph" +
                                         rebuild);
}

int64_t checked_plan_max_col(const SpmmArgs& a, const at::Tensor& buffer, at::IntArrayRef layout) {
  static CheckedContents checked;
  const std::vector<int64_t> key(layout.begin(), layout.end());
  if (const auto kept = checked.find({buffer}, key)) return *kept;
  auto section = [&](int s) {
    const int64_t offset = layout[kPlanHeader + 3 * s], n = layout[kPlanHeader + 3 * s + 1];
    const auto dtype = static_cast<at::ScalarType>(layout[kPlanHeader + 3 * s + 2]);
    return buffer.narrow(0, offset, n * static_cast<int64_t>(c10::elementSize(dtype))).view(dtype).to(at::kLong);
  };
  const int64_t n_rows = a.n_rows, nnz = a.col.numel();
  const int64_t n_blocks = ((n_rows + 31) / 32 + kBlockPanels - 1) / kBlockPanels;
  const at::Tensor stage = section(2).view({-1, 4});
  const at::Tensor mask = stage.select(1, 1);
  at::Tensor tiles_used = stage.select(1, 2).clone();  // first tile + tiles of the stage (bits of its mask)
  for (int q = 0; q < kBlockPanels; ++q) tiles_used += at::bitwise_and(at::bitwise_right_shift(mask, q), 1);
  const bool weighted = layout[1] == 1;
  at::Tensor row_end = at::zeros({0}, buffer.options().dtype(at::kLong));  // weighted: a bitmap row's last value
  if (weighted && section(4).numel()) {
    at::Tensor bits = section(3), count = at::zeros_like(bits);
    for (int k = 0; k < 32; ++k) count += at::bitwise_and(at::bitwise_right_shift(bits, k), 1);
    row_end = section(4) + count;
  }
  const at::Tensor first_last = at::cat({section(0).slice(0, 0, 1), section(0).slice(0, -1),
                                         section(8).slice(0, 0, 1), section(8).slice(0, -1),
                                         section(12).slice(0, 0, 1), section(12).slice(0, -1)});
  // Every range the kernels follow, one copy to the host: [min, max] pairs and smallest steps.
  const at::Tensor stats = at::cat({first_last, min_max(section(1)), min_max(stage.select(1, 0)), min_max(mask),
                                    min_max(stage.select(1, 2)), min_max(tiles_used), min_max(section(4)),
                                    min_max(row_end), min_max(section(5)), min_max(section(6)), min_max(section(7)),
                                    min_max(section(9)), min_max(section(10)), min_max(section(11)),
                                    min_max(section(13)), smallest_step(section(0)), smallest_step(section(8)),
                                    smallest_step(section(12))}).cpu();
  const int64_t* s = stats.data_ptr<int64_t>();
  const int64_t n_stages = stage.size(0), n_tiles = layout[kPlanHeader + 3 * 3 + 1] / 32;
  const int64_t n_dense = layout[kPlanHeader + 3 * 5 + 1], n_rem = layout[kPlanHeader + 3 * 6 + 1];
  const int64_t n_slots = layout[kPlanHeader + 3 * 13 + 1];
  auto in = [&](int pair, int64_t lo, int64_t hi) {  // pair of [min, max] within [lo, hi] (or empty)
    const int64_t mn = s[6 + 2 * pair], mx = s[6 + 2 * pair + 1];
    return mx < mn || (mn >= lo && mx <= hi);
  };
  const bool ok = s[0] == 0 && s[1] == n_stages && s[2] == 0 && s[3] == n_rem && s[4] == 0 && s[5] == n_slots &&
                  in(0, 0, n_blocks - 1) && in(1, 0, INT64_MAX) && in(2, 1, (1 << kBlockPanels) - 1) &&
                  in(3, 0, n_tiles) && in(4, 0, n_tiles) && in(5, 0, n_dense) && in(6, 0, n_dense) &&
                  in(7, 0, nnz - 1) && in(8, 0, INT64_MAX) && in(9, 0, nnz - 1) && in(10, 0, n_rows - 1) &&
                  in(11, -1, n_slots - 1) && in(12, 0, n_rows - 1) && in(13, 0, n_rows - 1) && s[34] >= 0 &&
                  s[35] >= 0 && s[36] >= 0;
  TORCH_CHECK(ok, "fgplugin.spmm: the kernel plan's contents do not fit this adjacency (" + num(n_rows) + " rows, " +
                      num(nnz) + " non-zeros): it belongs to another graph or is damaged; rebuild it with the "
                      "installed fgplugin (fgplugin.spmm does this for you)");
  const int64_t max_col = s[6 + 2 * 8 + 1];  // rem_col's largest id (-1 when empty)
  checked.remember({buffer}, max_col, key);
  return max_col;
}

}  // namespace fgplugin
