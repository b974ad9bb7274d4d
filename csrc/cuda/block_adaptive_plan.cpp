// Checks of the block-adaptive kernel plan against the op's arguments (format in
// block_adaptive_spmm.cuh). Kept out of the .cu file so that errors are thrown from C++ frames only.
#include "block_adaptive_spmm.cuh"

namespace fgplugin {

void check_block_plan(const SpmmArgs& a, at::TensorList plan) {
  TORCH_CHECK(plan.size() == static_cast<size_t>(kPlanLength) && plan[0].numel() == 4,
              "fgplugin.spmm: kernel plan has ", num(static_cast<int64_t>(plan.size())), " tensors, expected ",
              num(kPlanLength), " (plan format ", num(kPlanVersion), "); rebuild it with the installed fgplugin.kernel_plan");
  TORCH_CHECK(a.x.scalar_type() == at::kFloat || a.x.scalar_type() == at::kHalf || a.x.scalar_type() == at::kBFloat16,
              "fgplugin.spmm: the block-adaptive kernel takes float, half or bfloat16 x, got ", a.x.scalar_type());
  TORCH_CHECK(a.x.size(1) <= block_adaptive_max_features(a.x.scalar_type()), "fgplugin.spmm: F=", num(a.x.size(1)),
              " is too wide for the block-adaptive kernel; split the features into chunks of at most ",
              num(block_adaptive_max_features(a.x.scalar_type())));
  const auto& [meta, dblock_ptr, dwork, dstage, dtile_bits, dtile_roff, dense_eid, rem_col, rem_eid, item_ptr,
               item_row, item_slot, split_row, split_ptr, slot_row, dtile_frag, dpanel_dense] = BlockPlan(plan);
  const int64_t n_rows = a.n_rows, n_items = item_row.numel(), n_split = split_row.numel();
  const int64_t n_panels = (n_rows + 31) / 32;
  TORCH_CHECK(dblock_ptr.numel() == (n_panels + kBlockPanels - 1) / kBlockPanels + 1 &&
                  dpanel_dense.numel() == n_panels && item_ptr.numel() == n_items + 1 &&
                  item_slot.numel() == n_items && n_items >= n_rows && dstage.numel() % 4 == 0 &&
                  dtile_frag.numel() == dtile_bits.numel() && split_ptr.numel() == n_split + 1,
              "fgplugin.spmm: the kernel plan does not match this adjacency (", num(n_rows),
              " rows); rebuild it with fgplugin.kernel_plan.kernel_plans");
  TORCH_CHECK(dblock_ptr.scalar_type() == at::kInt && dwork.scalar_type() == at::kInt &&
                  dstage.scalar_type() == at::kInt && dtile_bits.scalar_type() == at::kInt &&
                  dtile_frag.scalar_type() == at::kInt && dpanel_dense.scalar_type() == at::kInt &&
                  item_slot.scalar_type() == at::kInt && split_ptr.scalar_type() == at::kInt &&
                  split_row.scalar_type() == at::kLong && rem_col.scalar_type() == a.rowptr.scalar_type() &&
                  item_ptr.scalar_type() == a.rowptr.scalar_type() && item_row.scalar_type() == a.rowptr.scalar_type(),
              "fgplugin.spmm: kernel plan dtypes do not match (plan format ", num(kPlanVersion), ")");
  if (a.values.has_value()) {
    TORCH_CHECK(rem_eid.numel() == rem_col.numel() && dtile_roff.numel() == dtile_bits.numel() &&
                    dtile_roff.scalar_type() == at::kLong && dense_eid.scalar_type() == at::kLong &&
                    rem_eid.scalar_type() == a.rowptr.scalar_type(),
                "fgplugin.spmm: this kernel plan was built for unit weights but edge values were given; "
                "build it with weighted=True (fgplugin.spmm does this for you)");
  }
  for (const auto& t : plan) {
    TORCH_CHECK(t.device() == a.x.device() && t.is_contiguous(), "fgplugin.spmm: kernel plan tensors must be "
                "contiguous and on ", a.x.device());
  }
}

}  // namespace fgplugin
