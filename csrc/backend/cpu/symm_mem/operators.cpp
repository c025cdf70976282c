// torch's symmetric-memory operators (torch.ops.symm_mem.*) for CPU tensors of a `tuned` group. torch registers them
// for CUDA only; on CPU the peers' buffers are plain shared memory, so the one-shot and two-shot all-reduces, the
// reduce-scatter and the signal-word writes keep their meaning and run here. The reduction is the engine's
// (kernels/reduce.h): each element is reduced over ranks 0..P-1 in order, as tuned's all_reduce does, so results are
// bit-identical to dist.all_reduce on the same group. Only "sum" is offered, as on CUDA.
//
// The input must be a symmetric tensor of the group (symm_mem.empty: its rendezvous is cached, so an operator
// communicates only through the signal pads; a tunedist.symmetric_empty tensor works too but rendezvouses on every
// call). A view inside the allocation is fine: every rank reads its peers at the same byte offset.
//
// What has no CPU counterpart is refused by name: the multimem_* operators and memcpy_to_multicast_ (multicast is an
// NVSwitch feature). The nvshmem_*/nccl_* operators belong to those backends and keep the dispatcher's own error.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "backend/cpu/checks.h"
#include "backend/cpu/symm_mem/memory.h"
#include "backend/cpu/symm_mem/operators.h"
#include "kernels/reduce.h"

namespace tunedist::cpu::symm_mem {

namespace {

namespace cm = c10d::symmetric_memory;

// The input's handle on the group and where the input sits in its allocation.
struct SymmInput {
  c10::intrusive_ptr<cm::SymmetricMemory> handle;
  size_t offsetBytes = 0;
  std::vector<void*> bases;  // every rank's allocation
};

SymmInput symmInput(const char* op, const at::Tensor& input, const std::string& group) {
  TORCH_CHECK(input.device().is_cpu() && input.layout() == c10::kStrided && input.is_contiguous(), "tunedist: ", op,
              ": the input must be a contiguous CPU tensor from torch.distributed._symmetric_memory.empty");
  SymmInput s;
  s.handle = cm::rendezvous(input, group);
  TORCH_CHECK(dynamic_cast<CpuSymmetricMemory*>(s.handle.get()) != nullptr, "tunedist: ", op,
              ": the input's symmetric memory is not tunedist's CPU one");
  s.offsetBytes = size_t(static_cast<const char*>(input.data_ptr()) - static_cast<const char*>(input.storage().data()));
  TORCH_CHECK(s.offsetBytes + input.nbytes() <= s.handle->get_buffer_size(), "tunedist: ", op,
              ": the input reaches past its symmetric allocation");
  s.bases = s.handle->get_buffer_ptrs();
  return s;
}

kernels::ReduceArgs sumArgs(const char* op, const std::string& reduceOp, at::ScalarType type) {
  TORCH_CHECK(reduceOp == "sum", "tunedist: ", op, ": reduce_op '", reduceOp,
              "' is not supported; only 'sum' is (as "
              "on CUDA)");
  kernels::ReduceArgs args;
  args.dtype = reduceDType(type);
  args.op = core::RedOp::kSum;
  return args;
}

// Rank p's copy of the element range [first, first + count) of the input.
std::vector<const void*> sources(const SymmInput& s, size_t firstByte) {
  std::vector<const void*> srcs(s.bases.size());
  for (size_t p = 0; p < s.bases.size(); ++p) {
    srcs[p] = static_cast<const char*>(s.bases[p]) + s.offsetBytes + firstByte;
  }
  return srcs;
}

// 1. barrier: every rank's input is written;
// 2. reduce every rank's input, read in place, into `out` (ours only);
// 3. barrier: every rank has read our input, which the caller may now overwrite.
at::Tensor& oneShotOut(const char* op, const at::Tensor& input, const std::string& reduceOp, const std::string& group,
                       at::Tensor& out) {
  const SymmInput s = symmInput(op, input, group);
  const auto args = sumArgs(op, reduceOp, input.scalar_type());
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == input.scalar_type() &&
                  out.numel() == input.numel(),
              "tunedist: ", op, ": out must be a contiguous CPU tensor of the input's dtype and size");
  TORCH_CHECK(!kernels::rangesOverlap(out.data_ptr(), input.data_ptr(), std::min(out.nbytes(), input.nbytes())) ||
                  input.numel() == 0,
              "tunedist: ", op, ": out must not overlap the input (peers read it)");
  s.handle->barrier(0, 0);
  const auto srcs = sources(s, 0);
  kernels::reduce(args, out.data_ptr(), srcs.data(), int(srcs.size()), size_t(input.numel()));
  s.handle->barrier(0, 0);
  return out;
}

at::Tensor oneShot(const at::Tensor& input, std::string reduceOp, std::string group) {
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  return oneShotOut("symm_mem.one_shot_all_reduce", input, reduceOp, group, out);
}

at::Tensor oneShotOutOp(const at::Tensor& input, std::string reduceOp, std::string group, at::Tensor out) {
  return oneShotOut("symm_mem.one_shot_all_reduce_out", input, reduceOp, group, out);
}

// local_input is copied into the front of symm_buffer first (the peers read it there).
at::Tensor& oneShotCopyOut(const char* op, const at::Tensor& symmBuffer, const at::Tensor& localInput,
                           const std::string& reduceOp, const std::string& group, at::Tensor& out) {
  TORCH_CHECK(symmBuffer.is_contiguous() && symmBuffer.numel() >= localInput.numel() &&
                  symmBuffer.scalar_type() == localInput.scalar_type(),
              "tunedist: ", op, ": symm_buffer must be contiguous, of local_input's dtype and at least its size");
  at::Tensor staged = symmBuffer.view(-1).narrow(0, 0, localInput.numel());
  staged.copy_(localInput.reshape(-1));
  at::Tensor flatOut = out.view(-1);
  oneShotOut(op, staged, reduceOp, group, flatOut);
  return out;
}

at::Tensor oneShotCopy(const at::Tensor& symmBuffer, const at::Tensor& localInput, std::string reduceOp,
                       std::string group) {
  at::Tensor out = at::empty_like(localInput, at::MemoryFormat::Contiguous);
  return oneShotCopyOut("symm_mem.one_shot_all_reduce_copy", symmBuffer, localInput, reduceOp, group, out);
}

at::Tensor oneShotCopyOutOp(const at::Tensor& symmBuffer, const at::Tensor& localInput, std::string reduceOp,
                            std::string group, at::Tensor out) {
  return oneShotCopyOut("symm_mem.one_shot_all_reduce_copy_out", symmBuffer, localInput, reduceOp, group, out);
}

// With the input cut into P cache-line-aligned slices, slice q owned by rank q:
// 1. barrier: every rank's input is written;
// 2. reduce slice `rank` of every rank's input into ours (in place), then copy it into the same slice of every
//    peer's input (only rank q touches slice q of any buffer between the barriers);
// 3. barrier: every input holds every slice's result.
at::Tensor& twoShotInPlace(const char* op, at::Tensor& input, const std::string& reduceOp, const std::string& group) {
  const SymmInput s = symmInput(op, input, group);
  const auto args = sumArgs(op, reduceOp, input.scalar_type());
  const int size = s.handle->get_world_size();
  const int rank = s.handle->get_rank();
  const size_t es = input.element_size();
  const size_t count = size_t(input.numel());
  constexpr size_t kLine = 64;
  const size_t sliceElems = ((count + size_t(size) - 1) / size_t(size) * es + kLine - 1) / kLine * kLine / es;
  const size_t first = std::min(size_t(rank) * sliceElems, count);
  const size_t last = std::min(first + sliceElems, count);
  s.handle->barrier(0, 0);
  if (last > first) {
    const auto srcs = sources(s, first * es);
    char* mine = static_cast<char*>(s.bases[size_t(rank)]) + s.offsetBytes + first * es;
    kernels::reduce(args, mine, srcs.data(), size, last - first);
    for (int p = 0; p < size; ++p) {
      if (p != rank) {
        std::memcpy(static_cast<char*>(s.bases[size_t(p)]) + s.offsetBytes + first * es, mine, (last - first) * es);
      }
    }
  }
  s.handle->barrier(0, 0);
  return input;
}

at::Tensor twoShot(at::Tensor input, std::string reduceOp, std::string group) {
  return twoShotInPlace("symm_mem.two_shot_all_reduce_", input, reduceOp, group);
}

at::Tensor twoShotOut(at::Tensor input, std::string reduceOp, std::string group, at::Tensor output) {
  twoShotInPlace("symm_mem.two_shot_all_reduce_out", input, reduceOp, group);
  output.copy_(input);
  return output;
}

// Rank r's output is chunk r of the sum: along dim 0, or along the last dimension with split_last_dim.
// 1. barrier; 2. reduce chunk `rank` of every rank's input, row by row, into the output; 3. barrier.
at::Tensor reduceScatterOut(at::Tensor input, std::string group, bool splitLastDim, at::Tensor output) {
  constexpr const char* kOp = "symm_mem.reduce_scatter_out";
  const SymmInput s = symmInput(kOp, input, group);
  const auto args = sumArgs(kOp, "sum", input.scalar_type());
  const int size = s.handle->get_world_size();
  const int rank = s.handle->get_rank();
  TORCH_CHECK(input.dim() >= 1, "tunedist: ", kOp, ": the input needs at least one dimension");
  const int64_t splitDim = splitLastDim ? input.dim() - 1 : 0;
  TORCH_CHECK(input.size(splitDim) % size == 0, "tunedist: ", kOp, ": dimension ", splitDim, " (", input.size(splitDim),
              ") does not divide by the world size ", size);
  TORCH_CHECK(output.is_contiguous() && output.scalar_type() == input.scalar_type() &&
                  output.numel() * size == input.numel(),
              "tunedist: ", kOp, ": output must be contiguous, of the input's dtype and 1/", size, " of its size");
  const size_t es = input.element_size();
  // A row: the run of elements that one chunk takes contiguously.
  const size_t rowElems = splitLastDim ? size_t(input.size(-1)) : size_t(input.numel());
  const size_t rows = rowElems == 0 ? 0 : size_t(input.numel()) / rowElems;
  const size_t chunk = rowElems / size_t(size);
  s.handle->barrier(0, 0);
  for (size_t r = 0; r < rows && chunk > 0; ++r) {
    const auto srcs = sources(s, (r * rowElems + size_t(rank) * chunk) * es);
    kernels::reduce(args, static_cast<char*>(output.data_ptr()) + r * chunk * es, srcs.data(), size, chunk);
  }
  s.handle->barrier(0, 0);
  return output;
}

void checkWords(const char* op, const at::Tensor& t, int64_t offset, int64_t count) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.element_size() == 4 &&
                  c10::isIntegralType(t.scalar_type(), false),
              "tunedist: ", op, ": the tensor must be a contiguous CPU tensor of 32-bit integers (a signal pad)");
  TORCH_CHECK(offset >= 0 && count >= 0 && offset + count <= t.numel(), "tunedist: ", op, ": words [", offset, ", ",
              offset + count, ") lie outside the tensor's ", t.numel());
}

at::Tensor memset32(at::Tensor& input, int64_t offset, int64_t val, int64_t count) {
  checkWords("symm_mem.memset32_", input, offset, count);
  auto* words = static_cast<uint32_t*>(input.data_ptr()) + offset;
  for (int64_t i = 0; i < count; ++i) {
    std::atomic_ref<uint32_t>(words[i]).store(uint32_t(val), std::memory_order_release);
  }
  return input;
}

// Release: what this thread wrote before is visible to a peer that reads the value.
at::Tensor streamWriteValue32(at::Tensor& input, int64_t offset, int64_t val) {
  checkWords("symm_mem.stream_write_value32_", input, offset, 1);
  std::atomic_ref<uint32_t>(static_cast<uint32_t*>(input.data_ptr())[offset])
      .store(uint32_t(val), std::memory_order_release);
  return input;
}

void refuseMulticast(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK(false, "tunedist: ", op.schema().name(),
              ": CPU symmetric memory has no multicast (an NVSwitch "
              "feature; has_multicast_support is False); use symm_mem.one_shot_all_reduce or two_shot_all_reduce_");
}

// Registers `fn` for `name`, or warns and goes on: a torch whose schema for it changed must not stop tunedist from
// loading (the dispatcher then keeps its own "no CPU kernel" error for that operator).
template <typename Fn>
void implOrWarn(torch::Library& lib, const char* name, Fn&& fn) {
  try {
    lib.impl(name, std::forward<Fn>(fn));
  } catch (const c10::Error& e) {
    TORCH_WARN("tunedist: symm_mem::", name, " has no CPU kernel in this torch: ", e.what_without_backtrace());
  }
}

}  // namespace

std::unique_ptr<torch::Library> registerOperators() {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "symm_mem", c10::DispatchKey::CPU, __FILE__,
                                              __LINE__);
  implOrWarn(*lib, "one_shot_all_reduce", oneShot);
  implOrWarn(*lib, "one_shot_all_reduce_out", oneShotOutOp);
  implOrWarn(*lib, "one_shot_all_reduce_copy", oneShotCopy);
  implOrWarn(*lib, "one_shot_all_reduce_copy_out", oneShotCopyOutOp);
  implOrWarn(*lib, "two_shot_all_reduce_", twoShot);
  implOrWarn(*lib, "two_shot_all_reduce_out", twoShotOut);
  implOrWarn(*lib, "reduce_scatter_out", reduceScatterOut);
  implOrWarn(*lib, "memset32_", memset32);
  implOrWarn(*lib, "stream_write_value32_", streamWriteValue32);
  for (const char* name : {"multimem_all_reduce_", "multimem_one_shot_all_reduce", "multimem_one_shot_all_reduce_out",
                           "multimem_one_shot_reduce_out", "multimem_all_gather_out", "memcpy_to_multicast_"}) {
    implOrWarn(*lib, name, torch::CppFunction::makeFromBoxedFunction<&refuseMulticast>());
  }
  return lib;
}

}  // namespace tunedist::cpu::symm_mem
