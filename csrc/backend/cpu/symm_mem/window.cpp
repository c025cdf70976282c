#include "backend/cpu/symm_mem/window.h"

#ifdef C10D_BACKEND_HAS_WINDOW

#include <atomic>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/work.h"

namespace tunedist::cpu::symm_mem {

namespace {
// One 64-bit counter per source rank in each rank's signal pad.
size_t windowPadBytes(int size) {
  return std::max<size_t>(size_t(size) * sizeof(uint64_t), shm::HeapOptions::kAlignment);
}

std::chrono::milliseconds timeoutOf(std::chrono::milliseconds requested, const SymmetricRegion& r) {
  return requested.count() > 0 ? requested : r.timeoutOr(0);
}
}  // namespace

CpuWindow::CpuWindow(const c10::intrusive_ptr<c10d::Backend>& owner, CpuBackend& cpu) : owner_(owner), cpu_(&cpu) {}

c10::intrusive_ptr<c10d::Backend> CpuWindow::lease(const char* op) const {
  auto owner = owner_.lock();
  TORCH_CHECK(owner, "tunedist: ", op, ": the process group of this window was destroyed");
  return owner;
}

SymmetricRegion& CpuWindow::region(const char* op) {
  TORCH_CHECK(region_ != nullptr, "tunedist: ", op,
              ": no tensor is registered with this window (pass one to "
              "new_window or call tensor_register on every rank)");
  return *region_;
}

// Collective: every rank registers a tensor of the same size (the exchange checks it, naming the ranks that differ).
void CpuWindow::tensor_register(const at::Tensor& tensor, bool owning) {
  constexpr const char* kOp = "Window.tensor_register";
  auto owner = lease(kOp);
  CpuBackend& cpu = *cpu_;
  TORCH_CHECK(region_ == nullptr, "tunedist: ", kOp, ": rank ", cpu.getRank(),
              ": a tensor is registered already; call tensor_deregister first");
  TORCH_CHECK(tensor.device().is_cpu() && tensor.layout() == c10::kStrided && tensor.is_contiguous(), "tunedist: ", kOp,
              ": rank ", cpu.getRank(), ": the window's tensor must be a contiguous CPU tensor, got ", tensor.device(),
              tensor.is_contiguous() ? "" : " (not contiguous)");
  const size_t bytes = tensor.nbytes();
  region_ = SymmetricRegion::rendezvous(owner, cpu, kOp, tensor.data_ptr(), bytes, windowPadBytes(cpu.getSize()));
  tensor_ = owning ? tensor : at::Tensor();
  sizes_ = tensor.sizes().vec();
  strides_ = tensor.strides().vec();
  dtype_ = tensor.scalar_type();
  std::lock_guard<std::mutex> lock(mutex_);
  consumed_.assign(size_t(cpu.getSize()), 0);
}

// Collective: a barrier first, so that no peer still puts into or reads our window once it is gone.
void CpuWindow::tensor_deregister() {
  constexpr const char* kOp = "Window.tensor_deregister";
  auto owner = lease(kOp);
  region(kOp);
  auto work = cpu_->barrier(c10d::BarrierOptions());
  if (work) {
    work->wait();
  }
  region_.reset();
  tensor_ = at::Tensor();
}

c10::intrusive_ptr<c10d::Work> CpuWindow::done(c10d::OpType type, const char* title,
                                               std::vector<at::Tensor> tensors) const {
  auto work = c10::make_intrusive<TunedWork>(region_ ? region_->rank() : 0, type, title, 0, tensors, tensors,
                                             std::chrono::milliseconds(0));
  work->complete();
  return work;
}

c10::intrusive_ptr<c10d::Work> CpuWindow::put(const at::Tensor& tensor, int64_t dstRank, int64_t targetOffsetNelems,
                                              bool /*asyncOp*/, const c10d::PutOptions& /*opts*/) {
  constexpr const char* kOp = "Window.put";
  SymmetricRegion& r = region(kOp);
  r.checkPeer(kOp, dstRank);
  TORCH_CHECK(tensor.device().is_cpu(), "tunedist: ", kOp, ": rank ", r.rank(), ": the tensor is on ", tensor.device(),
              ", the window on the CPU");
  TORCH_CHECK(tensor.scalar_type() == dtype_, "tunedist: ", kOp, ": rank ", r.rank(), ": the tensor is ",
              tensor.scalar_type(), ", the window ", dtype_);
  const int64_t windowElems = int64_t(r.bytes() / c10::elementSize(dtype_));
  TORCH_CHECK(targetOffsetNelems >= 0 && targetOffsetNelems + tensor.numel() <= windowElems, "tunedist: ", kOp,
              ": rank ", r.rank(), ": elements [", targetOffsetNelems, ", ", targetOffsetNelems + tensor.numel(),
              ") lie outside rank ", dstRank, "'s window of ", windowElems, " elements");
  const at::Tensor src = tensor.contiguous();
  std::memcpy(r.buffer(kOp, int(dstRank)) + size_t(targetOffsetNelems) * c10::elementSize(dtype_), src.data_ptr(),
              src.nbytes());
  return done(c10d::OpType::UNKNOWN, "tuned:window_put", {tensor});
}

at::Tensor CpuWindow::map_remote_tensor(int64_t rank) {
  constexpr const char* kOp = "Window.map_remote_tensor";
  SymmetricRegion& r = region(kOp);
  r.checkPeer(kOp, rank);
  // The view keeps the region (our pad, the weak hold on the group) alive; the mapping itself lives with the group.
  std::shared_ptr<SymmetricRegion> keep = region_;
  return at::from_blob(
      r.buffer(kOp, int(rank)), sizes_, strides_, [keep](void*) {},
      at::TensorOptions().dtype(dtype_).device(c10::kCPU));
}

c10::intrusive_ptr<c10d::Work> CpuWindow::signal(int64_t peerRank, bool /*asyncOp*/,
                                                 const c10d::SignalOptions& /*opts*/) {
  constexpr const char* kOp = "Window.signal";
  SymmetricRegion& r = region(kOp);
  r.checkPeer(kOp, peerRank);
  std::atomic_ref<uint64_t> counter(reinterpret_cast<uint64_t*>(r.pad(kOp, int(peerRank)))[r.rank()]);
  // Release: our puts into peerRank's window before this are visible to it once its wait_signal sees the count.
  // seq_cst: pairs with the waiter's count of sleepers (SymmetricRegion::notify).
  counter.fetch_add(1, std::memory_order_seq_cst);
  r.notify();
  return done(c10d::OpType::UNKNOWN, "tuned:window_signal", {});
}

c10::intrusive_ptr<c10d::Work> CpuWindow::wait_signal(int64_t peerRank, bool /*asyncOp*/,
                                                      const c10d::WaitSignalOptions& opts) {
  constexpr const char* kOp = "Window.wait_signal";
  SymmetricRegion& r = region(kOp);
  r.checkPeer(kOp, peerRank);
  std::atomic_ref<uint64_t> counter(reinterpret_cast<uint64_t*>(r.pad(kOp, r.rank()))[peerRank]);
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    target = consumed_[size_t(peerRank)] + 1;
  }
  // Acquire: peerRank's puts before its signal are visible once we see the count.
  r.waitFor(kOp, int(peerRank), timeoutOf(opts.timeout, r), c10::str("signal ", target),
            [&] { return counter.load(std::memory_order_seq_cst) >= target; });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    consumed_[size_t(peerRank)] = std::max(consumed_[size_t(peerRank)], target);
  }
  return done(c10d::OpType::UNKNOWN, "tuned:window_wait_signal", {});
}

c10d::WindowAttr CpuWindow::get_attr(int64_t peerRank) {
  constexpr const char* kOp = "Window.get_attr";
  region(kOp).checkPeer(kOp, peerRank);
  // One copy of the memory, reached by plain loads and stores from every rank of the host.
  return c10d::WindowAttr{c10d::WindowAccessType::UNIFIED};
}

}  // namespace tunedist::cpu::symm_mem

#endif  // C10D_BACKEND_HAS_WINDOW
