// The dispatcher's typed handles of the spmm ops, found once, for C++ that calls them through
// the dispatcher (so that each dispatch key's kernel runs: autograd, autocast, the device's):
// spmm_wrt_x.cpp and kept_call.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "common.h"

namespace fgplugin {

inline const c10::TypedOperatorHandle<SpmmOp>& spmm_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fgplugin::spmm", "").typed<SpmmOp>();
  return op;
}

inline const c10::TypedOperatorHandle<SpmmOp>& spmm_wrt_x_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fgplugin::spmm_wrt_x", "").typed<SpmmOp>();
  return op;
}

}  // namespace fgplugin
