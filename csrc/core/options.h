// Tunables of the shared-memory engine. Defaults suit training on a host with a few to a few dozen ranks; tests
// shrink them (tiny slots, short heartbeats) to reach every path cheaply. Environment overrides: see fromEnv().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/types.h"

namespace tunedist::core {

// How a rank copies into its own slot (shm/store_policy.h): chosen per group at run time from the measured cost of
// whole operations (shm/round_stores.h), or forced.
enum class SlotStores { kAuto, kCached, kStreaming };
// The TUNEDIST_SLOT_STORES spelling: auto, cached, streaming.
const char* slotStoresName(SlotStores mode);

struct ShmOptions {
  static constexpr size_t kDefaultSlotBytes = size_t(1) << 20;
  static constexpr size_t kDefaultOneShotMaxBytes = size_t(256) << 10;
  static constexpr size_t kDefaultHalfOneShotMaxBytes = size_t(64) << 10;
  static constexpr size_t kDefaultP2pChannelBytes = size_t(256) << 10;
  static constexpr int kDefaultSpinIters = 4000;
  static constexpr int kSpinItersAuto = -1;
  static constexpr size_t kDefaultCachedCopyMaxBytes = size_t(2) << 20;
  static constexpr size_t kDefaultBroadcastStreamBelowBytes = size_t(512) << 10;
  static constexpr size_t kDefaultBroadcastCachedCopyMaxBytes = size_t(16) << 20;
  static constexpr std::chrono::milliseconds kDefaultHeartbeatPeriod{100};
  static constexpr std::chrono::milliseconds kDefaultDeadAfter{1000};
  static constexpr std::chrono::milliseconds kDefaultSleepSlice{20};
  static constexpr std::chrono::seconds kDefaultSweepMinAge{30};
  static constexpr size_t kMeasuredSymmetricMinBytes = size_t(64) << 10;
  static constexpr size_t kDefaultSymmetricChunkBytes = size_t(64) << 20;
  static constexpr size_t kDefaultSymmetricHeapBytes = size_t(16) << 30;

  // Bytes of one data slot. Each rank owns kNumBuffers slots (double buffering), so a group of P ranks reserves
  // about P * 2 * slotBytes of shared memory (plus control pages) at its first collective.
  size_t slotBytes = kDefaultSlotBytes;
  // Messages up to this size (and up to one slot) use the one-shot algorithm; larger ones the pipelined
  // reduce-scatter + all-gather. The two-shot chunk is one slot. See oneShotMaxBytesFor().
  size_t oneShotMaxBytes = kDefaultOneShotMaxBytes;
  // The same limit for bf16 and fp16, which are reduced through float32 (convert, add, round back). The one-shot
  // algorithm has every rank do that for all N elements, the two-shot one for N/P, so it stops paying off at a
  // smaller size: measured on 2 ranks of a 2-vCPU Intel Xeon with AVX-512
  // (docs/performance.md#all-reduce-against-deepspeed-and-gloo), bf16 at 128 KiB took 0.99-1.22x DeepSpeed's time
  // one-shot and 0.80-0.89x two-shot, at 256 KiB 1.27-1.30x and 0.99x; float32 was the same either way at 256 KiB.
  size_t halfOneShotMaxBytes = kDefaultHalfOneShotMaxBytes;
  // Bytes of each ordered pair's send/recv ring.
  size_t p2pChannelBytes = kDefaultP2pChannelBytes;
  // Operations that receive at most this many bytes on a rank copy them out of the peers' slots with plain stores,
  // which leave the result in this core's cache; larger ones with streaming stores (copyBytes), which skip the
  // read-for-ownership but send everything to memory. Measured on 2 ranks of a 2-vCPU Intel Xeon with AVX-512
  // (docs/performance.md#store-placement-cached-or-streaming): cached made all_gather 1.1-1.4x and broadcast
  // 1.2-1.6x faster at 64 KiB-1 MiB.
  size_t cachedCopyMaxBytes = kDefaultCachedCopyMaxBytes;
  // Copies into our own slot: cached or streaming stores, chosen per group from their measured cost (kAuto), or
  // forced (TUNEDIST_SLOT_STORES=auto|cached|streaming). See shm/store_policy.h and shm/round_stores.h.
  SlotStores slotStores = SlotStores::kAuto;
  // A broadcast of fewer bytes has its root copy into the slot with streaming stores under kAuto (TUNEDIST_SLOT_STORES
  // =cached still forces cached ones). Only the readers read that slot, and a line they must snoop out of the root's
  // cache, where a cached copy of a chunk this small stays, costs them more than one from memory; from about the
  // size of a core's L2 the cached copy's lines have left for the shared cache and it is the faster one. Measured on
  // 2 ranks of a 2-vCPU AMD EPYC (Zen 4), both ways in one job
  // (docs/performance.md#store-placement-cached-or-streaming): streaming / cached time 0.92-0.93 at 16 KiB, 0.68-0.69
  // at 64 KiB, 0.68-0.75 at 256 KiB, 0.97-1.17 at 512 KiB, 1.92-1.95 at 1 MiB. Under kAuto a broadcast of 8 KiB up to
  // one slot only starts that way: the group's RoundStoreChooser probes both (in another phase of the same host cached
  // was the faster at 64 KiB, 0.73x).
  size_t broadcastStreamBelowBytes = kDefaultBroadcastStreamBelowBytes;
  // An all_gather chunk of at least this many bytes is copied into our slot and our own output block in one pass
  // over the input (shm/allgather.cpp) instead of two copies; SIZE_MAX keeps the two
  // (TUNEDIST_FUSED_OWN_COPY_MIN_BYTES).
  size_t fusedOwnCopyMinBytes = 0;
  // An all_gather that receives more than this many bytes (counted as for cachedCopyMaxBytes, whose streaming copies
  // out then write the peers' blocks) writes its own output block with streaming stores too, fused or not: the output
  // is larger than the caches either way, and a cached store first reads each line it writes
  // (TUNEDIST_OWN_CACHED_COPY_MAX_BYTES; SIZE_MAX keeps the own block cached).
  size_t ownCachedCopyMaxBytes = kDefaultCachedCopyMaxBytes;
  // cachedCopyMaxBytes for the readers of a broadcast, whose only work is that copy, counted over all of them (they
  // share the last-level cache): plain stores leave the output in the shared cache, streaming ones send it to memory,
  // and up to about half a 32 MiB L3 the plain copy wins. Measured on 2 ranks of a 2-vCPU AMD EPYC (Zen 4), one job
  // (docs/performance.md#store-placement-cached-or-streaming): plain / streaming time 0.55-0.62 at 3-8 MiB, 0.85-0.94
  // at 12-16 MiB, 0.86-0.96 at 24-32 MiB, 0.98-1.10 at 48-64 MiB; 4 ranks on 2 cores, per-reader bytes: 16 MiB 1.08.
  size_t broadcastCachedCopyMaxBytes = kDefaultBroadcastCachedCopyMaxBytes;
  // Busy-poll iterations (with a pause hint) before a waiter yields and then sleeps on the futex. kSpinItersAuto (the
  // default; forRanks() resolves it for a group): kDefaultSpinIters when each of the group's ranks on this host can
  // have a CPU of its own (core/cpus.h), else 0. With more ranks than CPUs the rank a waiter waits for is often queued
  // behind it on the same CPU, and every pause turn delays it: 4 ranks on a 2-vCPU AMD EPYC ran every collective of
  // 1-512 KiB in 0.17-0.76 of the time yielding at once (a 64 KiB all_reduce: 180 us spinning 4000 turns), and
  // zero-copy, which waits twice per call, lost to copying until then (docs/performance.md#symmetric-buffers).
  int spinIters = kSpinItersAuto;
  // The job's processes on this host (LOCAL_WORLD_SIZE, as torchrun sets it; 0: unknown): a group smaller than that,
  // such as one of several tensor-parallel groups, still shares the host's CPUs with the rest, so forRanks() counts the
  // larger of the two.
  int localWorldSize = 0;
  // How often each rank's heartbeat thread bumps its counter in shared memory.
  std::chrono::milliseconds heartbeatPeriod = kDefaultHeartbeatPeriod;
  // Last resort only, where a peer's life lock (sync.h) cannot tell whether it is alive: a peer whose heartbeat has
  // not moved for this long is then declared dead. A stopped process still holds its lock, so it is never dead.
  std::chrono::milliseconds deadAfter = kDefaultDeadAfter;
  // Longest single futex sleep; bounds how late a waiter notices a timeout, an abort or a dead peer.
  std::chrono::milliseconds sleepSlice = kDefaultSleepSlice;
  // Directory that holds POSIX shared memory (for the start-up sweep and the free-space message).
  const char* shmDir = "/dev/shm";
  // The start-up sweep removes only names of dead jobs at least this old: a younger one may belong to a job that
  // is still attaching.
  std::chrono::seconds sweepMinAge = kDefaultSweepMinAge;
  // Symmetric buffers (shm/heap.h, shm/zero_copy/). Unset (the default): collectives on buffers from the group's
  // symmetric heap of at least kMeasuredSymmetricMinBytes run zero-copy or copying, per collective and size class, as
  // the group measures them (shm/zero_copy/path_chooser.h): one threshold set on one machine was wrong on another
  // (docs/performance.md#symmetric-buffers). Set (TUNEDIST_SYMMETRIC_MIN_BYTES): those of at least this many bytes
  // always run zero-copy (the stores still measured), smaller ones copy.
  std::optional<size_t> symmetricMinBytes;
  // The heap grows in chunks of at least this many bytes, up to symmetricHeapBytes per rank and group.
  size_t symmetricChunkBytes = kDefaultSymmetricChunkBytes;
  size_t symmetricHeapBytes = kDefaultSymmetricHeapBytes;

  // Defaults overridden by TUNEDIST_SLOT_BYTES, TUNEDIST_ONESHOT_MAX_BYTES (both one-shot limits),
  // TUNEDIST_SPIN_ITERS, TUNEDIST_DEAD_AFTER_MS, TUNEDIST_HEARTBEAT_MS, TUNEDIST_SWEEP_MIN_AGE_S,
  // TUNEDIST_SYMMETRIC_MIN_BYTES, TUNEDIST_SYMMETRIC_CHUNK_BYTES, TUNEDIST_SYMMETRIC_HEAP_BYTES,
  // TUNEDIST_CACHED_COPY_MAX_BYTES, TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES, TUNEDIST_BROADCAST_STREAM_BELOW_BYTES,
  // TUNEDIST_FUSED_OWN_COPY_MIN_BYTES, TUNEDIST_OWN_CACHED_COPY_MAX_BYTES, TUNEDIST_SLOT_STORES where set.
  static ShmOptions fromEnv();
  // Throws tunedist::core::Error when a value is out of range.
  void validate() const;
  // These options for a group of `localRanks` ranks on this host: spinIters resolved (see there) for the larger of
  // `localRanks` and localWorldSize.
  ShmOptions forRanks(int localRanks) const;
  // The least buffer on the symmetric heap that may run zero-copy: symmetricMinBytes when set, else
  // kMeasuredSymmetricMinBytes (under it the copying one-shot algorithms, one synchronisation against zero-copy's
  // two, are not measured against it).
  size_t zeroCopyMinBytes() const { return symmetricMinBytes.value_or(kMeasuredSymmetricMinBytes); }
  // The largest all_reduce of `dtype` that runs one-shot: oneShotMaxBytes, for bf16/fp16 at most
  // halfOneShotMaxBytes, never more than one slot.
  size_t oneShotMaxBytesFor(DType dtype) const;
};

// Tunables of a group that spans several hosts (backend/engine/hier).
struct CrossHostOptions {
  static constexpr size_t kMinChunkBytes = size_t(1) << 20;
  static constexpr size_t kMaxChunkBytes = size_t(8) << 20;
  static constexpr size_t kTargetChunks = 4;
  // Bytes of the buffer per pipeline chunk of the hierarchical all-reduce: gloo carries chunk k between hosts while
  // shared memory reduces chunk k+1 (TUNEDIST_CROSS_HOST_CHUNK_BYTES). Unset: chunkBytesFor() chooses per call.
  std::optional<size_t> chunkBytes;

  // The chunk of an all-reduce of `bytes`: chunkBytes when set, else bytes / kTargetChunks within [kMinChunkBytes,
  // kMaxChunkBytes]. A call of one chunk runs its phases one after another and leaves the link idle during the
  // shared-memory ones; a few chunks let gloo carry one while shared memory works on the next. Measured at 2 x 2
  // ranks over a 1 Gbit/s link, the hosts network namespaces on a 2-vCPU AMD EPYC
  // (docs/performance.md#several-hosts-over-a-shaped-link): under other jobs' load a 4 MiB call held 0.79 of the
  // line rate with 8 MiB chunks and 0.95 with 1 MiB chunks (one run); on a quiet host both chunkings held 0.91-1.02
  // at 4-16 MiB, and 64 MiB 0.98-1.01 either way.
  size_t chunkBytesFor(size_t bytes) const;

  static CrossHostOptions fromEnv();
  // Throws tunedist::core::Error when a value is out of range.
  void validate() const;
};

}  // namespace tunedist::core
