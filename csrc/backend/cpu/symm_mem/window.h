// CpuWindow: c10d's one-sided window (torch/csrc/distributed/c10d/Window.hpp) for CPU tensors of a one-host `tuned`
// group, over one SymmetricRegion. The registered tensor must lie in the group's symmetric heap (symm_mem.empty,
// tunedist.symmetric_empty; a contiguous view of one, at any offset, is fine): peers map it, so
//   put(t, dst, off)       copies t into dst's window at element `off` (a store into shared memory: done on return);
//   map_remote_tensor(r)   is rank r's window as a tensor (same shape, strides and dtype as ours);
//   signal(peer)           adds 1 to the counter for us in peer's signal pad (release: our earlier puts into peer's
//                          window are visible to it once its wait_signal returns);
//   wait_signal(peer)      waits until peer's counter in our pad passes the signals we already consumed from it,
//                          and consumes one (acquire). Signals count: two signals satisfy two waits.
//   get_attr(peer)         UNIFIED: one coherent copy, loads and stores reach it directly.
// Every call completes before it returns (a CPU store needs no progress engine); the Work it returns is complete,
// async_op or not. Waits end at the timeout (the options', else the group's), on a dead peer (naming it) and when the
// group fails (SymmetricRegion). Groups that span hosts are refused at the rendezvous: a put would have to become a
// send that the target posts a receive for, which is not one-sided.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>  // C10D_BACKEND_HAS_WINDOW

// c10d has windows from torch 2.14 on (Window.hpp); before that there is nothing for a CpuWindow to implement.
#ifdef C10D_BACKEND_HAS_WINDOW
#include <torch/csrc/distributed/c10d/Window.hpp>

#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu/symm_mem/region.h"

namespace tunedist::cpu::symm_mem {

class CpuWindow final : public c10d::Window {
 public:
  // `owner` is the group's CPU backend (the object torch holds), `cpu` its CPU side; held weakly, as the region does.
  CpuWindow(const c10::intrusive_ptr<c10d::Backend>& owner, CpuBackend& cpu);

  void tensor_register(const at::Tensor& tensor, bool owning = true) override;
  void tensor_deregister() override;
  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dstRank, int64_t targetOffsetNelems,
                                     bool asyncOp, const c10d::PutOptions& opts = c10d::PutOptions()) override;
  at::Tensor map_remote_tensor(int64_t rank) override;
  c10::intrusive_ptr<c10d::Work> signal(int64_t peerRank, bool asyncOp,
                                        const c10d::SignalOptions& opts = c10d::SignalOptions()) override;
  c10::intrusive_ptr<c10d::Work> wait_signal(int64_t peerRank, bool asyncOp,
                                             const c10d::WaitSignalOptions& opts = c10d::WaitSignalOptions()) override;
  c10d::WindowAttr get_attr(int64_t peerRank) override;

 private:
  // The registered region; throws naming `op` when no tensor is registered.
  SymmetricRegion& region(const char* op);
  // A complete Work for a call that already ran.
  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, const char* title, std::vector<at::Tensor> tensors) const;

  // The backend, strongly, for a collective call; throws naming `op` once the group was destroyed.
  c10::intrusive_ptr<c10d::Backend> lease(const char* op) const;

  c10::weak_intrusive_ptr<c10d::Backend> owner_;
  CpuBackend* cpu_;  // valid while owner_ is
  std::shared_ptr<SymmetricRegion> region_;
  at::Tensor tensor_;  // the registered tensor, when the window owns it
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  at::ScalarType dtype_ = at::kFloat;
  std::mutex mutex_;                // guards consumed_
  std::vector<uint64_t> consumed_;  // signals consumed from each peer
};

}  // namespace tunedist::cpu::symm_mem

#endif  // C10D_BACKEND_HAS_WINDOW
