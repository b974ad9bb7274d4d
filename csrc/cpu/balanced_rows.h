// Row-parallel loops over a CSR whose chunks balance work (non-zeros + rows), shared by the CPU
// spmm and sddmm kernels.
//
// Rows are cut into chunks of equal work, so a power-law hub row does not leave one thread with
// most of the graph. One task per thread runs under at::parallel_for (OpenMP in PyTorch's builds;
// it follows torch.set_num_threads) and claims chunks from a shared counter, so a thread that
// starts late (another process holds its core) leaves its chunks to the others instead of
// stalling the op. Small products (below MIN_PARALLEL_WORK) run inline: waking the pool costs
// more than they do.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace fgplugin {

// Below this much work (non-zeros + rows) one thread does the whole product.
constexpr int64_t MIN_PARALLEL_WORK = 1 << 15;
// Chunks per thread: enough that a late thread's share can be taken over, few enough that the
// shared counter is not contended.
constexpr int64_t CHUNKS_PER_THREAD = 16;

// First row r with rowptr[r] + r >= target: chunk boundaries that balance non-zeros plus rows.
template <typename index_t>
int64_t row_at_work(const index_t* rowptr, int64_t n_rows, int64_t target) {
  int64_t lo = 0, hi = n_rows;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(rowptr[mid]) + mid < target) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Calls body(row_begin, row_end) over disjoint row ranges that cover [0, n_rows).
template <typename index_t, typename F>
void parallel_over_balanced_rows(const index_t* rowptr, int64_t n_rows, F&& body) {
  const int64_t work = static_cast<int64_t>(rowptr[n_rows]) + n_rows;
  const int64_t n_threads = std::min<int64_t>(at::get_num_threads(), work / MIN_PARALLEL_WORK);
  if (n_threads <= 1 || at::in_parallel_region()) {
    body(int64_t(0), n_rows);
    return;
  }
  const int64_t n_chunks = std::max<int64_t>(1, std::min<int64_t>(n_rows, CHUNKS_PER_THREAD * n_threads));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, n_threads, 1, [&](int64_t, int64_t) {
    for (int64_t chunk = next.fetch_add(1, std::memory_order_relaxed); chunk < n_chunks;
         chunk = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t row_begin = row_at_work(rowptr, n_rows, work * chunk / n_chunks);
      const int64_t row_end = chunk + 1 == n_chunks ? n_rows : row_at_work(rowptr, n_rows, work * (chunk + 1) / n_chunks);
      if (row_begin < row_end) body(row_begin, row_end);
    }
  });
}

}  // namespace fgplugin
