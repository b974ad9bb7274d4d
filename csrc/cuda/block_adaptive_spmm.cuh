// Block-adaptive SpMM: dense 32x32 tiles on tensor cores + row-balanced CSR remainder.
//
// The plan is built by fgplugin/kernel_plan.py (the format is private between the two files;
// kPlanVersion must match kernel_plan.PLAN_VERSION). It reaches the op as one byte buffer on the
// device of x plus a host-side layout (int64 list), so the kernel learns every size without a
// device->host sync:
//
//   layout = [version, weighted, chunk, kPlanSections, then per section: byte offset, numel, dtype]
//
// (dtype as the value of c10::ScalarType; offsets are multiples of 16). "idx" = the adjacency's
// index dtype (int32 or int64). The sections, in order:
//
//   0 dblock_ptr   int32[n_blocks + 1]  stages of row block b (kBlockPanels = 4 row panels of 32
//                                       rows) = [ptr[b], ptr[b+1])
//   1 dwork        int32[n_work]        blocks with >= 1 stage, most dense tiles first (LPT order)
//   2 dstage       int32[n_stages * 4]  one stage = one column panel (32 columns) of one block that
//                                       holds >= 1 dense tile: (column panel, panel mask: bit q = row
//                                       panel q of the block has a tile there, first tile, 0)
//   3 dtile_bits   int32[n_tiles * 32]  bitmap: bit k of word r = entry (r, k) of the tile; tiles in
//                                       (block, column panel, row panel) order: the tile of row
//                                       panel q of a stage is first + popcount(mask & ((1 << q) - 1))
//   4 dtile_roff   int64[n_tiles * 32]  weighted only (else empty): offset in dense_eid of row r
//   5 dense_eid    int64[nnz_dense]     weighted only: CSR position of each dense entry (tile, row,
//                                       col order), to read its value from `values`
//   6 rem_col      idx[nnz_rem]         remainder (non-dense entries) in CSR order: column
//   7 rem_eid      idx[nnz_rem]         weighted only: CSR position of each remainder entry
//   8 item_ptr     idx[n_items + 1]     work items = chunks of <= chunk remainder entries of one
//                                       row; every row has >= 1 item (empty rows too)
//   9 item_row     idx[n_items]
//  10 item_slot    int32[n_items]       -1: the item is its row's only one and writes out directly;
//                                       else the row of the fp32 partial buffer it writes
//  11 split_row    int64[n_split]       rows with > 1 item, combined by a second small pass
//  12 split_ptr    int32[n_split + 1]   their slots [split_ptr[s], split_ptr[s+1]) (consecutive)
//  13 slot_row     int32[n_slots]       row of each slot (its size sizes the partial buffer)
//  14 dtile_frag   int32[n_tiles * 32]  the bitmap again, in the layout of the m16n8k8 A fragments:
//                                       word l = lane l (g = l / 4, t = l % 4); bit 16 m + 4 ks + j
//                                       = entry (16 m + g + 8 (j & 1), 8 ks + t + 4 (j >> 1)), so a
//                                       lane reads its 32 TF32 A values of a tile from one word
//  15 dpanel_dense int32[n_panels]      1 where the row panel holds dense tiles (its raw dense
//                                       partial is in `out` when the remainder pass runs)
//
// A TF32/bf16/fp16 run is chosen from x's dtype and at::globalContext().allowTF32CuBLAS().
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "../common.h"

namespace fgplugin {

constexpr int64_t kPlanVersion = 3;
constexpr int kPlanSections = 16;
constexpr int kPlanHeader = 4;  // version, weighted, chunk, kPlanSections
constexpr int kBlockPanels = 4;  // row panels of 32 per block of the dense kernel

// One section of a plan: a typed array inside the plan's byte buffer (accessors named as
// at::Tensor's, so the launch code reads like tensor code).
struct PlanArray {
  void* ptr = nullptr;
  int64_t n = 0;
  int64_t numel() const { return n; }
  template <typename T>
  T* data_ptr() const {
    return static_cast<T*>(ptr);
  }
};

// The plan's sections by name (order as in the table above). `layout` must have passed
// check_block_plan.
struct BlockPlan {
  PlanArray dblock_ptr, dwork, dstage, dtile_bits, dtile_roff, dense_eid, rem_col, rem_eid, item_ptr, item_row,
      item_slot, split_row, split_ptr, slot_row, dtile_frag, dpanel_dense;
  BlockPlan(const at::Tensor& buffer, at::IntArrayRef layout) {
    PlanArray* sections[kPlanSections] = {&dblock_ptr, &dwork,     &dstage,    &dtile_bits, &dtile_roff, &dense_eid,
                                          &rem_col,    &rem_eid,   &item_ptr,  &item_row,   &item_slot,  &split_row,
                                          &split_ptr,  &slot_row,  &dtile_frag, &dpanel_dense};
    auto* base = static_cast<uint8_t*>(buffer.data_ptr());
    for (int s = 0; s < kPlanSections; ++s) {
      sections[s]->ptr = base + layout[kPlanHeader + 3 * s];
      sections[s]->n = layout[kPlanHeader + 3 * s + 1];
    }
  }
};

// Checks that the plan (buffer + layout) fits the arguments (block_adaptive_plan.cpp): its layout
// on every call, its contents once per version of the buffer; throws with a clear message.
void check_block_plan(const SpmmArgs& a, const at::Tensor& buffer, at::IntArrayRef layout);
// The largest column id of the plan's remainder after checking every index of its contents.
int64_t checked_plan_max_col(const SpmmArgs& a, const at::Tensor& buffer, at::IntArrayRef layout);

// Widest F the dense kernel's grid covers for x of `dtype`.
int64_t block_adaptive_max_features(at::ScalarType dtype);

// out = diag(r) (A + diag(d)) diag(c) x with the block-adaptive kernels on the current stream;
// x is float, half or bf16; `partial` is an fp32 [max(n_slots, 1), F] scratch buffer. Never
// throws: launch errors come back as the cudaError_t.
cudaError_t launch_block_adaptive_spmm(const SpmmArgs& a, const BlockPlan& plan, const at::Tensor& out,
                                       const at::Tensor& partial, bool tf32);

}  // namespace fgplugin
