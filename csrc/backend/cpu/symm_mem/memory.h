// CpuSymmetricMemory: torch's SymmetricMemory (torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp) for CPU
// tensors of a `tuned` group, over one SymmetricRegion: get_buffer(rank, ...) is a CPU tensor over that rank's
// memory (shared memory every rank of the host maps), and barrier / put_signal / wait_signal use the signal pads as
// torch's CUDA backend does:
//   put_signal(dst, ch)   waits until word [ch * world_size + rank] of dst's pad is 0, then sets it to 1;
//   wait_signal(src, ch)  waits until word [ch * world_size + src] of our pad is 1, then sets it to 0.
// Each set and clear is a sequentially consistent compare-and-swap: what a rank wrote into a peer's buffer before
// put_signal is visible to that peer once its wait_signal returns. timeout_ms 0 means the group's timeout.
//   barrier(ch)           each rank bumps its own epoch counter of channel ch (past the torch signal words of its
//                         pad, where no user code looks) and waits until every peer's has reached it. Built on
//                         put_signal/wait_signal, as on CUDA, a rank's second barrier would wait until each peer
//                         had consumed its first signal: one more hand-off per barrier, which on a loaded host costs
//                         a scheduling delay each time; a counter never waits for a reader. The signal words are
//                         left alone, so they stay zero as torch's note on signal pads asks.
// What a CPU has no counterpart for refuses (device pointer arrays) or answers as torch's API expects for an
// absent feature (multicast: false and a null pointer).
#pragma once

#include <torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>

#include <memory>
#include <vector>

#include "backend/cpu/symm_mem/region.h"

namespace tunedist::cpu::symm_mem {

class CpuSymmetricMemory final : public c10d::symmetric_memory::SymmetricMemory {
 public:
  // `region`'s pads hold padBytesFor(signalBytes, world size): the torch signal words, then the barrier epochs.
  CpuSymmetricMemory(std::shared_ptr<SymmetricRegion> region, size_t signalBytes);
  static size_t padBytesFor(size_t signalBytes, int worldSize);

  std::vector<void*> get_buffer_ptrs() override { return region_->buffers("SymmetricMemory.buffer_ptrs"); }
  std::vector<void*> get_signal_pad_ptrs() override { return region_->pads("SymmetricMemory.signal_pad_ptrs"); }
  void** get_buffer_ptrs_dev() override;
  void** get_signal_pad_ptrs_dev() override;
  size_t get_buffer_size() override { return region_->bytes(); }
  // The rendezvous is made on the allocation itself, never on a block inside a pool.
  size_t get_offset() override { return 0; }
  bool has_multicast_support() override { return false; }
  void* get_multicast_ptr() override { return nullptr; }

  void barrier(int channel, size_t timeout_ms) override;
  void put_signal(int dst_rank, int channel, size_t timeout_ms) override;
  void wait_signal(int src_rank, int channel, size_t timeout_ms) override;

  int get_rank() override { return region_->rank(); }
  int get_world_size() override { return region_->size(); }
  c10::Device get_device() override { return c10::Device(c10::kCPU); }
  // Every rank of a CPU group with symmetric memory is on this host and mapped here.
  bool world_within_direct_access() override { return true; }

  const std::shared_ptr<SymmetricRegion>& region() const { return region_; }

 private:
  // Word [channel * world_size + slot] of rank `padRank`'s pad; refuses a channel the pad has no room for.
  uint32_t* signalWord(const char* op, int padRank, int channel, int slot);
  // Rank `padRank`'s epoch counter of barrier channel `channel`.
  uint64_t* epochWord(const char* op, int padRank, int channel);
  size_t channels() const { return signalBytes_ / sizeof(uint32_t) / size_t(region_->size()); }
  void putSignal(const char* op, int dst, int channel, std::chrono::milliseconds timeout);
  void waitSignal(const char* op, int src, int channel, std::chrono::milliseconds timeout);

  std::shared_ptr<SymmetricRegion> region_;
  const size_t signalBytes_;
  std::vector<uint64_t> epochs_;  // barriers this rank has entered, per channel
};

}  // namespace tunedist::cpu::symm_mem
