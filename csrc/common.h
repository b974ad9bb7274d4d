// What the ops' CPU and CUDA implementations share: message helpers and the argument checks
// (args.cpp). Every op has its schema in csrc/<op>.cpp, its CPU kernel in csrc/cpu/<op>_cpu.cpp
// and its CUDA kernel in csrc/cuda/<op>_cuda.cpp (+ a .cu launcher); cpu/register_cpu.cpp and
// cuda/register_cuda.cpp register them.
//
// Conventions (docs/design.md, "TiledAdjacency"): A is CSR with rows = destination nodes and
// cols = source nodes; rowptr and col share one index dtype (int32 or int64). Edge values and the
// row/column scales are stored in the accumulation dtype of x (float for half/bfloat16/float,
// double for double), so one plan serves every feature precision.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <optional>
#include <string>

namespace fgplugin {

// Numbers in error messages go through std::to_string, never through the ostream of c10::str: on
// the H100 machine (torch 2.11 built with gcc-toolset-13, this extension with the system g++ 13),
// streaming an integer into an error message segfaulted the process, while text and dtypes
// streamed fine.
inline std::string num(int64_t value) { return std::to_string(value); }

inline std::string dims(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

inline at::ScalarType aux_dtype_for(at::ScalarType x_dtype) {
  return x_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

template <typename T>
const T* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// The signature of each op (schema in csrc/<op>.cpp), which its CPU and CUDA kernels share
// (declared in cpu/ops_cpu.h and cuda/ops_cuda.h).
using SpmmOp = at::Tensor(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                          const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                          const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                          const std::optional<at::Tensor>& plan, at::IntArrayRef plan_layout,
                          const std::optional<at::Tensor>& t_rowptr, const std::optional<at::Tensor>& t_col,
                          const std::optional<at::Tensor>& t_values, const std::optional<at::Tensor>& t_plan,
                          at::IntArrayRef t_plan_layout, const std::optional<at::Tensor>& bias, int64_t width);
using SddmmOp = at::Tensor(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b);
using DropoutOp = at::Tensor(const at::Tensor& x, double p, int64_t seed);
using NonzeroRowsOp = at::Tensor(const at::Tensor& x);
using PadColumnsOp = at::Tensor(const at::Tensor& x, int64_t width);
using SpmmIfOp = void(const at::Tensor& flag, const at::Tensor& rowptr, const at::Tensor& col,
                      const std::optional<at::Tensor>& values, const at::Tensor& x,
                      const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale,
                      const std::optional<at::Tensor>& diag, const at::Tensor& out);

// The spmm arguments after checks, made contiguous: what both device kernels consume. The output
// is [n_rows, width] (width <= x's columns: the first ones), plus bias when given.
struct SpmmArgs {
  at::Tensor rowptr, col, x;
  std::optional<at::Tensor> values, row_scale, col_scale, diag, bias;
  int64_t n_rows, width;
};

// The sddmm arguments after checks, made contiguous.
struct SddmmArgs {
  at::Tensor rowptr, col, a, b;
  int64_t n_rows;
};

// Argument checks (args.cpp). They throw c10::Error with a message that says what to fix.
// They are compiled by the host C++ compiler only, and the CUDA ops call them from C++ files
// (cuda/<op>_cuda.cpp) before any nvcc-compiled code runs: an exception unwinding through
// nvcc-compiled host frames crashed the process with torch 2.11 + CUDA 13 on the H100 machine.
SpmmArgs prepare_spmm(const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
                      const at::Tensor& x, const std::optional<at::Tensor>& row_scale,
                      const std::optional<at::Tensor>& col_scale, const std::optional<at::Tensor>& diag,
                      const std::optional<at::Tensor>& bias, int64_t width);
// The op's result from the full product `out` ([n_rows, x's columns]) of a kernel that does not
// apply the epilogue itself: its first a.width columns, plus a.bias (added in place, in out's dtype).
at::Tensor with_epilogue(const at::Tensor& out, const SpmmArgs& a);
SddmmArgs prepare_sddmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b);
// The largest column id of the CSR (rowptr, col), -1 without entries, after checking its contents
// (csr_contents.cpp: once per version of the two tensors); throws when they are not a valid CSR.
int64_t checked_max_col(const at::Tensor& rowptr, const at::Tensor& col, const char* op);
void check_nonzero_rows(const at::Tensor& x);
void check_pad_columns(const at::Tensor& x, int64_t width);
// spmm_if's flag (one bool on x's device) and out ([n_rows, x's columns], x's dtype, contiguous).
void check_spmm_if(const at::Tensor& flag, const SpmmArgs& a, const at::Tensor& out);

}  // namespace fgplugin
