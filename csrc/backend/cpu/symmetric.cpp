// Symmetric buffers: tensors from this rank's symmetric heap (shm/heap.h), for FSDP2's staging buffers and for users
// who call collectives on their own buffers (tunedist.symmetric_empty).
#include "backend/cpu/cpu_backend.h"
#include "backend/engine/symmetric_host.h"

namespace tunedist::cpu {

at::Tensor CpuBackend::allocateTensor(long size, at::TensorOptions options) {
  constexpr const char* kOp = "allocate_tensor";
  TORCH_CHECK(size >= 0, "tunedist: ", kOp, ": rank ", rank_, ": size must be >= 0, got ", size);
  TORCH_CHECK(!options.has_device() || options.device().is_cpu(), "tunedist: ", kOp, ": rank ", rank_,
              ": the CPU side allocates CPU tensors only, got device ", options.device());
  TORCH_CHECK(!options.has_layout() || options.layout() == c10::kStrided, "tunedist: ", kOp, ": rank ", rank_,
              ": only strided (dense) tensors can be symmetric");
  const auto dtype = options.has_dtype() ? options.dtype() : caffe2::TypeMeta::Make<float>();
  const size_t bytes = std::max<size_t>(size_t(size) * dtype.itemsize(), 1);
  void* ptr = heap_->allocate(bytes);
  std::shared_ptr<shm::SymmetricHeap> heap = heap_;
  return at::from_blob(
      ptr, {int64_t(size)}, [heap](void* p) { heap->free(p); },
      options.device(c10::kCPU).dtype(dtype).layout(c10::kStrided).requires_grad(false));
}

// Every element of `t` (a view included) lies in one chunk of our heap.
bool CpuBackend::isSymmetric(const at::Tensor& t) const {
  if (!t.device().is_cpu() || t.layout() != c10::kStrided || t.numel() == 0) {
    return false;
  }
  // The elements span [data + lowest offset, data + highest offset + one element).
  int64_t lo = 0;
  int64_t hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const char* first = static_cast<const char*>(t.data_ptr()) + lo * int64_t(t.element_size());
  shm::HeapRef ref;
  return heap_->locate(first, size_t(hi - lo + 1) * t.element_size(), &ref);
}

shm::zero_copy::SymmetricPeers CpuBackend::exchangeSymmetric(const char* op, const char* title, void* ptr, size_t bytes,
                                                             std::chrono::milliseconds timeout) {
  shm::HeapRef ref;
  guardCall(op, [&] {
    TORCH_CHECK(bytes > 0 && heap_->locate(ptr, bytes, &ref), "the tensor (", bytes,
                " bytes) is not in this rank's symmetric heap of the group: allocate it from this group's heap "
                "(torch.distributed._symmetric_memory.empty for the default group; for another, "
                "_SymmetricMemory.empty_strided_p2p(..., group_name) or tunedist.symmetric_empty(..., group=))");
  });
  shm::zero_copy::SymmetricPeers peers;
  auto work = launch(c10d::OpType::UNKNOWN, title, {}, {}, /*asyncOp=*/false, timeout, bytes,
                     [&](engine::HostCollectives& engine, const core::OpContext& ctx) {
                       auto* host = dynamic_cast<engine::SymmetricHost*>(&engine);
                       if (host == nullptr) {
                         throw core::Error(core::detail::str(
                             ctx.name,
                             ": the group spans several hosts; symmetric memory and windows need every "
                             "rank on one host, where each maps its peers' memory"));
                       }
                       peers = host->exchangeSymmetric(ctx, ptr, ref, bytes);
                     });
  if (work) {
    work->wait();
  }
  return peers;
}

}  // namespace tunedist::cpu
