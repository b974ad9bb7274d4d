// Block-adaptive SpMM (issue 3): dense 32x32 tiles on tensor cores + row-balanced CSR remainder.
//
// The plan is a list of tensors built by fgplugin/kernel_plan.py (the format is private between
// the two files; kPlanVersion must match kernel_plan.PLAN_VERSION). All tensors live on the device
// of x. "idx" = the adjacency's index dtype (int32 or int64).
//
//   0 meta        int64[4]   (version, tile size = 32, weighted, chunk) on the device; the kernel
//                            checks only its numel (never syncs on its contents)
//   1 dpanel_ptr  int32[n_panels + 1]  dense tiles of row panel p (32 rows) = [ptr[p], ptr[p+1])
//   2 dwork       int32[n_work]        panels with >= 1 dense tile, most tiles first (LPT order)
//   3 dtile_cp    int32[n_tiles]       column panel (32 columns) of each dense tile
//   4 dtile_bits  int32[n_tiles * 32]  bitmap: bit k of word r = entry (r, k) of the tile
//   5 dtile_roff  int64[n_tiles * 32]  weighted only (else empty): offset in dense_eid of row r
//   6 dense_eid   int64[nnz_dense]     weighted only: CSR position of each dense entry (tile, row,
//                                      col order), to read its value from `values`
//   7 rem_col     idx[nnz_rem]         remainder (non-dense entries) in CSR order: column
//   8 rem_eid     idx[nnz_rem]         weighted only: CSR position of each remainder entry
//   9 item_ptr    idx[n_items + 1]     work items = chunks of <= chunk remainder entries of one
//                                      row; every row has >= 1 item (empty rows too)
//  10 item_row    idx[n_items]
//  11 item_slot   int32[n_items]       -1: the item is its row's only one and writes out directly;
//                                      else the row of the fp32 partial buffer it writes
//  12 split_row   int64[n_split]       rows with > 1 item, combined by a second small pass
//  13 split_ptr   int32[n_split + 1]   their slots [split_ptr[s], split_ptr[s+1]) (consecutive)
//  14 slot_row    int32[n_slots]       row of each slot (its numel sizes the partial buffer
//                                      without a device->host sync)
//
// A TF32/bf16/fp16 run is chosen from x's dtype and at::globalContext().allowTF32CuBLAS().
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "../spmm.h"

namespace fgplugin {

constexpr int64_t kPlanVersion = 1;
constexpr int kPlanLength = 15;

// The plan's tensors by name (indices as in the table above); `plan` must hold kPlanLength tensors.
struct BlockPlan {
  const at::Tensor &meta, &dpanel_ptr, &dwork, &dtile_cp, &dtile_bits, &dtile_roff, &dense_eid, &rem_col, &rem_eid,
      &item_ptr, &item_row, &item_slot, &split_row, &split_ptr, &slot_row;
  explicit BlockPlan(at::TensorList p)
      : meta(p[0]), dpanel_ptr(p[1]), dwork(p[2]), dtile_cp(p[3]), dtile_bits(p[4]), dtile_roff(p[5]),
        dense_eid(p[6]), rem_col(p[7]), rem_eid(p[8]), item_ptr(p[9]), item_row(p[10]), item_slot(p[11]),
        split_row(p[12]), split_ptr(p[13]), slot_row(p[14]) {}
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
