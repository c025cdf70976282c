// CpuSymmetricMemoryAllocator: torch's SymmetricMemoryAllocator for CPU tensors, over the symmetric heaps of `tuned`
// groups (shm/heap.h), registered for c10::DeviceType::CPU when tunedist's Python package loads (registerAllocator).
// So torch.distributed._symmetric_memory.empty(..., device="cpu") and rendezvous(t, group) work unchanged on a tuned
// group, and the tensors are the same heap's as tunedist.symmetric_empty's: zero-copy in tuned collectives, and
// either kind can be rendezvoused.
//
//   alloc(size, -1, group_name)  a block of that group's heap (the default group, "0", when torch passes none, as
//                                symm_mem.empty does).
//   rendezvous(ptr, group_name)  collective on the group: a CpuSymmetricMemory whose buffers are every rank's
//                                allocation. Cached per allocation and group, as torch's CUDA allocator does, so a
//                                second call on the same tensor returns the same handle without communicating.
//                                A tensor from tunedist.symmetric_empty (not allocated here) is rendezvoused too,
//                                without the cache: this allocator never sees it freed, and a later block at the
//                                same address must not meet a stale handle.
// The heap must belong to the group of the rendezvous (peers map the chunks through that group's segment): a
// tensor from the default group's heap rendezvoused on a sub-group is refused, naming how to allocate for it.
#pragma once

#include <torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/cpu/symm_mem/memory.h"
#include "backend/cpu/symm_mem/operators.h"
#include "shm/heap.h"

namespace tunedist::cpu::symm_mem {

class CpuSymmetricMemoryAllocator final : public c10d::symmetric_memory::SymmetricMemoryAllocator {
 public:
  void* alloc(size_t size, int device_idx, const std::optional<std::string>& group_name) override;
  void free(void* ptr) override;
  size_t get_alloc_size(void* ptr) override;
  c10::intrusive_ptr<c10d::symmetric_memory::SymmetricMemory> rendezvous(
      void* ptr, const std::optional<std::string>& group_name) override;
  bool has_multicast_support(int /*device_idx*/) override { return false; }
  c10::DeviceType supported_device_type() override { return c10::DeviceType::CPU; }
  std::string name() override { return "TUNED"; }
  // Allocated here, or a live block of the default group's heap (tunedist.symmetric_empty). torch asks it from 2.14
  // on (is_symm_mem_tensor); on an older torch only tunedist does.
  bool has_allocation(void* ptr)
#ifdef TUNEDIST_SYMM_MEM_HAS_ALLOCATION
      override
#endif
      ;

  // The symm_mem operators' CPU kernels (operators.h), registered with the allocator and kept as long as it is.
  std::unique_ptr<torch::Library> operators;

 private:
  struct Allocation {
    std::shared_ptr<shm::SymmetricHeap> heap;
    size_t bytes = 0;
    std::map<std::string, c10::intrusive_ptr<CpuSymmetricMemory>> handles;  // by group name
  };
  std::mutex mutex_;
  std::unordered_map<void*, Allocation> allocations_;
};

// Registers the allocator with torch for CPU tensors, and the symm_mem operators' CPU kernels (once per process).
void registerAllocator();

}  // namespace tunedist::cpu::symm_mem
