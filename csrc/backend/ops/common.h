// Helpers shared by the collective entry points: dtype and reduce-op translation, tensor checks, contiguous
// staging, and the guard that turns a local caller error into a group-wide failure.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/reduce.h"
#include "core/types.h"

namespace tunedist::ops {

// The engine's element type for a reduction; throws naming the op for a dtype the engine cannot reduce.
shm::DType reduceDType(at::ScalarType type, const char* op);
// ReduceOp (with its PREMUL_SUM factor) to the engine's arguments for `worldSize` ranks; throws if unsupported.
shm::ReduceArgs reduceArgs(const c10d::ReduceOp& op, at::ScalarType type, int worldSize, const char* opName);

// A dense CPU tensor; throws naming the op and what was wrong.
void checkCpuDense(const at::Tensor& t, const char* op, const char* what);
// Same dtype and element count as `ref`; throws naming both.
void checkLike(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* what);
size_t tensorBytes(const at::Tensor& t);
// True if the storage bytes of `a` and `b` overlap.
bool overlaps(const at::Tensor& a, const at::Tensor& b);

// `src`, or a copy of it when it overlaps the block of another rank in `blocks` (blocks[p] receives rank p's data),
// so peers' data cannot overwrite it before it is sent. A source that is exactly our own block stays in place
// (FSDP2's in-place all-gather).
at::Tensor unaliasedSource(const at::Tensor& src, const std::vector<at::Tensor>& blocks, int rank);

// A contiguous tensor with t's values: t itself when contiguous, else a copy (to copy back with copyBack()).
inline at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
inline void copyBack(const at::Tensor& t, const at::Tensor& s) {
  if (!t.is_same(s)) {
    t.copy_(s);
  }
}

// Runs `checks`; if one throws, fails the group through backend.rejectCall (so peers do not wait) and rethrows.
template <typename F>
void guardCall(TunedBackend& backend, const char* op, F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    backend.rejectCall(op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    backend.rejectCall(op, e.what());
  }
}

}  // namespace tunedist::ops
