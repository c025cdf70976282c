#include "backend/cpu/symm_mem/allocator.h"

#include "backend/cpu/symm_mem/group.h"
#include "backend/tuned_backend.h"

namespace tunedist::cpu::symm_mem {

namespace cm = c10d::symmetric_memory;

void* CpuSymmetricMemoryAllocator::alloc(size_t size, int device_idx, const std::optional<std::string>& group_name) {
  constexpr const char* kOp = "symm_mem.empty";
  TORCH_CHECK(device_idx <= 0, "tunedist: ", kOp, ": CPU symmetric memory has no device index; got ", device_idx);
  const TunedGroup g = resolveTunedGroup(kOp, group_name);
  std::shared_ptr<shm::SymmetricHeap> heap = g.tuned->cpu().heap();
  void* ptr = heap->allocate(std::max<size_t>(size, 1));
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_[ptr] = Allocation{std::move(heap), size, {}};
  return ptr;
}

void CpuSymmetricMemoryAllocator::free(void* ptr) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      return;
    }
    a = std::move(it->second);
    allocations_.erase(it);
  }
  // The cached handles go first: their signal pads return to the heap, whose last reference may be `a.heap`.
  a.handles.clear();
  a.heap->free(ptr);
}

size_t CpuSymmetricMemoryAllocator::get_alloc_size(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(ptr);
  TORCH_CHECK(it != allocations_.end(), "tunedist: symm_mem: ", ptr, " was not allocated by the CPU allocator");
  return it->second.bytes;
}

bool CpuSymmetricMemoryAllocator::has_allocation(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (allocations_.count(ptr) != 0) {
      return true;
    }
  }
  try {
    return resolveTunedGroup("symm_mem.is_symm_mem_tensor", std::nullopt).tuned->cpu().heap()->blockBytes(ptr) != 0;
  } catch (const std::exception&) {
    return false;  // no default tuned group: nothing else can be symmetric
  }
}

// 1. Resolve the group; a cached handle of this allocation on this group is the answer (no communication).
// 2. The allocation's size: ours from alloc(), else the heap block's (tunedist.symmetric_empty's tensors).
// 3. The collective exchange (SymmetricRegion::rendezvous), outside the lock: a tensor freed on another thread
//    meanwhile must not wait for it.
c10::intrusive_ptr<cm::SymmetricMemory> CpuSymmetricMemoryAllocator::rendezvous(
    void* ptr, const std::optional<std::string>& group_name) {
  constexpr const char* kOp = "symm_mem.rendezvous";
  const TunedGroup g = resolveTunedGroup(kOp, group_name);
  size_t bytes = 0;
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it != allocations_.end()) {
      auto h = it->second.handles.find(g.name);
      if (h != it->second.handles.end()) {
        return h->second;
      }
      bytes = std::max<size_t>(it->second.bytes, 1);
      ours = true;
    }
  }
  CpuBackend& cpu = g.tuned->cpu();
  if (!ours) {
    bytes = cpu.heap()->blockBytes(ptr);  // 0: not a heap block; the exchange refuses it, failing the group
  }
  const size_t signalBytes = cm::get_signal_pad_size();
  auto region = SymmetricRegion::rendezvous(g.backend, cpu, kOp, ptr, bytes,
                                            CpuSymmetricMemory::padBytesFor(signalBytes, cpu.getSize()));
  auto handle = c10::make_intrusive<CpuSymmetricMemory>(std::move(region), signalBytes);
  if (ours) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it != allocations_.end()) {
      it->second.handles[g.name] = handle;
    }
  }
  return handle;
}

void registerAllocator() {
  // Once: a second registration of the operators would be an error, and the first allocator's tensors stay valid.
  if (cm::has_allocator(c10::DeviceType::CPU) &&
      dynamic_cast<CpuSymmetricMemoryAllocator*>(cm::get_allocator(c10::DeviceType::CPU).get()) != nullptr) {
    return;
  }
  auto allocator = c10::make_intrusive<CpuSymmetricMemoryAllocator>();
  allocator->operators = registerOperators();
  cm::register_allocator(c10::DeviceType::CPU, allocator);
}

}  // namespace tunedist::cpu::symm_mem
