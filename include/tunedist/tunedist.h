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
// NCCL.
//
// Tunables come from the environment; a value out of range throws, naming the variable. The defaults suit
// training; the ones most often set:
//   TUNEDIST_SLOT_BYTES           bytes of one shared-memory slot (1 MiB; a multiple of 4096, at most 1 GiB); a group
//                                 of P ranks on a host reserves about 2 * P slots at its first collective
//   TUNEDIST_ONESHOT_MAX_BYTES    largest all_reduce that runs one-shot (256 KiB; bf16, fp16 64 KiB; sets both)
//   TUNEDIST_SYMMETRIC_MIN_BYTES  from this size a collective on a symmetric buffer always runs zero-copy (unset:
//                                 from 64 KiB the group measures per op and size class whether zero-copy is faster)
//   TUNEDIST_SIMD                 force a SIMD level of the reduction: scalar, avx2 or avx512 (default: the best the
//                                 CPU supports)
//   TUNEDIST_HOST_ID              split ranks that share memory into separate hosts (default: one host per machine)
//   TUNEDIST_DEAD_AFTER_MS        a peer whose liveness cannot be read otherwise is dead after this silence (1000)
//   TUNEDIST_SYNC_WORK=always     every call returns a Work, also one that ran inline (see above)
// The project's design document (docs/design.md in the source distribution) gives each setting's reason.
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
