// tunedist for LibTorch users: create the `tuned` c10d backend from C++.
//
//   #include <tunedist/tunedist.h>
//   auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
//   c10::intrusive_ptr<c10d::Backend> backend = tunedist::createBackend(store, rank, worldSize);
//   std::vector<at::Tensor> t{at::ones({1024})};
//   backend->allreduce(t)->wait();
//
// A call with asyncOp = false (AllreduceOptions and the others default to true) that the backend runs inline returns
// an empty Work pointer, as torch.distributed expects of a backend that synchronised at the C++ level: the call has
// completed (or thrown its failure) when it returns. Check the pointer before waiting on such a call, or set
// TUNEDIST_SYNC_WORK=always to get a completed Work every time.
//
// CPU tensors go through shared memory among the ranks of this host; a group made here must fit on one host (a
// group that spans hosts needs the gloo factory that `import tunedist` gives it from Python). CUDA tensors go to
// NCCL. Tunables come from the environment (TUNEDIST_SLOT_BYTES, TUNEDIST_ONESHOT_MAX_BYTES, TUNEDIST_SPIN_ITERS,
// TUNEDIST_DEAD_AFTER_MS, TUNEDIST_HEARTBEAT_MS, TUNEDIST_SWEEP_MIN_AGE_S, TUNEDIST_SIMD, TUNEDIST_HOST_ID,
// TUNEDIST_CROSS_HOST_CHUNK_BYTES): see csrc/core/options.h.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tunedist {

// The default timeout of every operation, as torch's (30 minutes).
constexpr std::chrono::milliseconds kDefaultTimeout{30 * 60 * 1000};

// Creates the backend for `rank` of `size` ranks. `store` must be shared by exactly these ranks (give each group
// its own c10d::PrefixStore). Shared memory is reserved at the group's first collective.
c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout = kDefaultTimeout);

// "tunedist <version> (torch <version it was built against>)".
std::string versionString();

}  // namespace tunedist
