// Checks of the block-adaptive kernel plan (buffer + layout, format in block_adaptive_spmm.cuh)
// against the op's arguments. Host-side only (no device reads), and kept out of the .cu files so
// that errors are thrown from C++ frames only. The plan's contents are trusted: fgplugin builds
// plans on the device from a validated adjacency (fgplugin/kernel_plan.py) and never reads them
// from disk.
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
}

}  // namespace fgplugin
