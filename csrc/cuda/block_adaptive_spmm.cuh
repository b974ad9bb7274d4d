// Block-adaptive SpMM (issue 3): dense 32x32 tiles on tensor cores + row-balanced CSR remainder.
//
// The plan is a list of tensors built by fgplugin/kernel_plan.py (the format is private between
// the two files; kPlanVersion must match kernel_plan.PLAN_VERSION). All tensors live on the device
// of x. "idx" = the adjacency's index dtype (int32 or int64).
//
//   0 meta         int64[4]   (version, tile size = 32, weighted, chunk) on the device; the kernel
//                             checks only its numel (never syncs on its contents)
//   1 dblock_ptr   int32[n_blocks + 1]  stages of row block b (kBlockPanels = 4 row panels of 32
//                                       rows) = [ptr[b], ptr[b+1])
//   2 dwork        int32[n_work]        blocks with >= 1 stage, most dense tiles first (LPT order)
//   3 dstage       int32[n_stages * 4]  one stage = one column panel (32 columns) of one block that
//                                       holds >= 1 dense tile: (column panel, panel mask: bit q = row
//                                       panel q of the block has a tile there, first tile, 0)
//   4 dtile_bits   int32[n_tiles * 32]  bitmap: bit k of word r = entry (r, k) of the tile; tiles in
//                                       (block, column panel, row panel) order: the tile of row
//                                       panel q of a stage is first + popcount(mask & ((1 << q) - 1))
//   5 dtile_roff   int64[n_tiles * 32]  weighted only (else empty): offset in dense_eid of row r
//   6 dense_eid    int64[nnz_dense]     weighted only: CSR position of each dense entry (tile, row,
//                                       col order), to read its value from `values`
//   7 rem_col      idx[nnz_rem]         remainder (non-dense entries) in CSR order: column
//   8 rem_eid      idx[nnz_rem]         weighted only: CSR position of each remainder entry
//   9 item_ptr     idx[n_items + 1]     work items = chunks of <= chunk remainder entries of one
//                                       row; every row has >= 1 item (empty rows too)
//  10 item_row     idx[n_items]
//  11 item_slot    int32[n_items]       -1: the item is its row's only one and writes out directly;
//                                       else the row of the fp32 partial buffer it writes
//  12 split_row    int64[n_split]       rows with > 1 item, combined by a second small pass
//  13 split_ptr    int32[n_split + 1]   their slots [split_ptr[s], split_ptr[s+1]) (consecutive)
//  14 slot_row     int32[n_slots]       row of each slot (its numel sizes the partial buffer
//                                       without a device->host sync)
//  15 dtile_frag   int32[n_tiles * 32]  the bitmap again, in the layout of the m16n8k8 A fragments:
//                                       word l = lane l (g = l / 4, t = l % 4); bit 16 m + 4 ks + j
//                                       = entry (16 m + g + 8 (j & 1), 8 ks + t + 4 (j >> 1)), so a
//                                       lane reads its 32 TF32 A values of a tile from one word
//  16 dpanel_dense int32[n_panels]      1 where the row panel holds dense tiles (its raw dense
//                                       partial is in `out` when the remainder pass runs)
//
// A TF32/bf16/fp16 run is chosen from x's dtype and at::globalContext().allowTF32CuBLAS().
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "../spmm.h"

namespace fgplugin {

constexpr int64_t kPlanVersion = 2;
constexpr int kPlanLength = 17;
constexpr int kBlockPanels = 4;  // row panels of 32 per block of the dense kernel

// The plan's tensors by name (indices as in the table above); `plan` must hold kPlanLength tensors.
struct BlockPlan {
  const at::Tensor &meta, &dblock_ptr, &dwork, &dstage, &dtile_bits, &dtile_roff, &dense_eid, &rem_col, &rem_eid,
      &item_ptr, &item_row, &item_slot, &split_row, &split_ptr, &slot_row, &dtile_frag, &dpanel_dense;
  explicit BlockPlan(at::TensorList p)
      : meta(p[0]), dblock_ptr(p[1]), dwork(p[2]), dstage(p[3]), dtile_bits(p[4]), dtile_roff(p[5]),
        dense_eid(p[6]), rem_col(p[7]), rem_eid(p[8]), item_ptr(p[9]), item_row(p[10]), item_slot(p[11]),
        split_row(p[12]), split_ptr(p[13]), slot_row(p[14]), dtile_frag(p[15]), dpanel_dense(p[16]) {}
};

// Checks that `plan` fits the arguments (block_adaptive_plan.cpp); throws with a clear message.
void check_block_plan(const SpmmArgs& a, at::TensorList plan);

// Widest F the dense kernel's grid covers for x of `dtype`.
int64_t block_adaptive_max_features(at::ScalarType dtype);

// out = diag(r) (A + diag(d)) diag(c) x with the block-adaptive kernels on the current stream;
// x is float, half or bf16; `partial` is an fp32 [max(n_slots, 1), F] scratch buffer. Never
// throws: launch errors come back as the cudaError_t.
cudaError_t launch_block_adaptive_spmm(const SpmmArgs& a, at::TensorList plan, const at::Tensor& out,
                                       const at::Tensor& partial, bool tf32);

}  // namespace fgplugin
