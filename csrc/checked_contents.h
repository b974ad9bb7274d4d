// A memory of the tensors whose contents were checked, so that a check that reads a whole graph
// (csr_contents.cpp, cuda/block_adaptive_plan.cpp) runs once per version of its tensors, not per
// call. A tensor is remembered by its storage (held weakly, so a freed one never matches), offset,
// sizes, strides, dtype and version counter (another view of the same memory is another tensor:
// its entries differ): any in-place write through torch makes it new again; writes through
// .numpy() or .data are not seen. Inference tensors have no version counter and are never kept.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace fgplugin {

class CheckedContents {
 public:
  // The value stored for exactly these tensors (and `extra`, e.g. a layout), if they were checked.
  std::optional<int64_t> find(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& extra = {}) {
    if (!trackable(tensors)) return std::nullopt;
    const std::lock_guard<std::mutex> guard(lock_);
    for (const Entry& e : entries_) {
      if (e.extra == extra && e.tensors.size() == tensors.size() && matches(e.tensors, tensors)) return e.value;
    }
    return std::nullopt;
  }

  void remember(const std::vector<at::Tensor>& tensors, int64_t value, const std::vector<int64_t>& extra = {}) {
    if (!trackable(tensors)) return;
    Entry entry{{}, extra, value};
    for (const at::Tensor& t : tensors) {
      entry.tensors.push_back(State{t.storage().getWeakStorageImpl(), t.storage_offset(), t.sizes().vec(),
                                    t.strides().vec(), t.scalar_type(), t._version()});
    }
    const std::lock_guard<std::mutex> guard(lock_);
    if (entries_.size() >= kKept) entries_.erase(entries_.begin());
    entries_.push_back(std::move(entry));
  }

 private:
  struct State {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    int64_t version;
  };
  struct Entry {
    std::vector<State> tensors;
    std::vector<int64_t> extra;
    int64_t value;
  };
  static constexpr size_t kKept = 256;  // graphs (and their transposes, restrictions, shards, plans)

  static bool trackable(const std::vector<at::Tensor>& tensors) {
    for (const at::Tensor& t : tensors) {
      if (t.is_inference() || !t.has_storage()) return false;
    }
    return true;
  }

  static bool matches(const std::vector<State>& states, const std::vector<at::Tensor>& tensors) {
    for (size_t i = 0; i < states.size(); ++i) {
      const State& s = states[i];
      const at::Tensor& t = tensors[i];
      if (s.storage.expired() || s.storage._unsafe_get_target() != t.storage().unsafeGetStorageImpl() ||
          s.offset != t.storage_offset() || s.dtype != t.scalar_type() || s.version != t._version() ||
          t.sizes() != at::IntArrayRef(s.sizes) || t.strides() != at::IntArrayRef(s.strides)) {
        return false;
      }
    }
    return true;
  }

  std::mutex lock_;
  std::vector<Entry> entries_;  // most recently checked last
};

// [min, max] of an integer tensor as int64, (0, -1) when empty; and the smallest step of a
// monotone one (0 for fewer than two entries). Each is one reduction on the tensor's device.
inline at::Tensor min_max(const at::Tensor& t) {
  if (t.numel() == 0) return at::tensor({int64_t(0), int64_t(-1)}, t.options().dtype(at::kLong));
  return at::stack({t.min(), t.max()}).to(at::kLong);
}

inline at::Tensor smallest_step(const at::Tensor& t) {
  if (t.numel() < 2) return at::zeros({1}, t.options().dtype(at::kLong));
  return at::diff(t.to(at::kLong)).min().reshape({1});
}

}  // namespace fgplugin
