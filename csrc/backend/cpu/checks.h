// Helpers shared by the CPU side's entry points: dtype and reduce-op translation, tensor checks and contiguous
// staging. A failed check throws what was wrong only; the entry point's guardCall (or p2p's checkP2pCall) puts
// the op and the rank in front once: "tunedist: all_reduce: rank 1 of 2: the tensor is on cuda:0; ...".
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "backend/engine/tensors.h"
#include "core/types.h"
#include "kernels/reduce.h"

namespace tunedist::cpu {

// The engine's element type for a reduction; throws for a dtype the engine cannot reduce.
core::DType reduceDType(at::ScalarType type);
// ReduceOp (with its PREMUL_SUM factor) to the engine's arguments for `worldSize` ranks; throws if unsupported.
kernels::ReduceArgs reduceArgs(const c10d::ReduceOp& op, at::ScalarType type, int worldSize);

// A root rank inside the group.
void checkRoot(int64_t root, int size);
// A dense CPU tensor; throws naming `what` ("the input") and what was wrong.
void checkCpuDense(const at::Tensor& t, const char* what);
// Same dtype and element count as `ref`; throws naming both.
void checkLike(const at::Tensor& t, const at::Tensor& ref, const char* what);
// The engines' tensor helpers (backend/engine/tensors.h), under the names the entry points use.
using tunedist::engine::copyBack;
using tunedist::engine::overlaps;
using tunedist::engine::staged;
using tunedist::engine::tensorBytes;

// `src`, or a copy of it when it overlaps the block of another rank in `blocks` (blocks[p] receives rank p's data),
// so peers' data cannot overwrite it before it is sent. A source that is exactly our own block stays in place
// (FSDP2's in-place all-gather).
at::Tensor unaliasedSource(const at::Tensor& src, const std::vector<at::Tensor>& blocks, int rank);

// `count` equal, consecutive 1-D slices of the contiguous tensor `t` (blocks of an all-gather output or a
// reduce-scatter input), aliasing t's bytes; cheap enough to make per call.
std::vector<at::Tensor> flatSlices(const at::Tensor& t, int count);

}  // namespace tunedist::cpu
