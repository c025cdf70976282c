// NcclSide: the CUDA half of a TunedBackend. When a group maps both `cpu` and `cuda` to `tuned`, torch creates one
// backend object for both device types; TunedBackend sends each call with CUDA tensors here, and this holds the
// c10d::Backend that torch itself would make for "nccl", so stream semantics, CUDA futures, error handling, the
// watchdog and every c10d feature of that backend are torch's.
//
// Which backend: a Factory makes it. From Python (every group torch creates) the factory calls torch's own registered
// creator for "nccl" (python/tunedist/__init__.py, _CudaSide): on torch 2.15 that is c10d::nccl2::ProcessGroupNCCL
// unless TORCH_DIST_USE_NCCL2=0, and whatever a later torch means by the name. Without a factory (a LibTorch program
// calling tunedist::createBackend) nccl_factory.cpp makes the same choice in C++ (createNcclBackend).
//
// The backend is created at the first CUDA call, at the first query that only a CUDA backend can answer, or when
// torch binds the group to a CUDA device (eagerConnectSingleDevice): a CPU-only job never touches CUDA or NCCL. It
// gets a PrefixStore of the group's store under its own prefix, the group's timeout, name, description and bound
// device. What was asked of the group before it existed (hooks, timing) is applied to it at creation (whenCreated).
// abort and shutdown are forwarded once; after them no backend is created.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tunedist/tunedist.h"

namespace tunedist::cuda {

// Facts about the NCCL side of this build, for logs and tests.
struct NcclBuildInfo {
  bool compiledIn = false;
  std::string headerVersion;  // "2.30.7": the nccl.h this build compiled against; empty without NCCL
  std::string torchVersion;   // the NCCL version torch was built with (torch::cuda::nccl::version())
};
NcclBuildInfo ncclBuildInfo();

class NcclSide {
 public:
  // Called once, right after the backend is created (not under any lock): the Python module logs what NCCL will use
  // there.
  using CreatedHook = std::function<void(int rank, int size)>;

  // What a factory gets: the group's view of itself at the moment the CUDA side is made.
  struct CreateArgs {
    c10::intrusive_ptr<c10d::Store> store;  // already under the NCCL side's own prefix
    int rank = 0;
    int size = 0;
    std::chrono::milliseconds timeout{kDefaultTimeout};
    std::string groupUid;
    std::optional<at::Device> device;  // the group's bound CUDA device, if any
  };
  // Returns the backend, or null to leave the choice to createNcclBackend. Errors are c10::Errors (or Python errors
  // turned into them); the caller names op and rank.
  using Factory = std::function<c10::intrusive_ptr<c10d::Backend>(const CreateArgs&)>;

  struct Options {
    std::chrono::milliseconds timeout = kDefaultTimeout;
    CreatedHook onCreated;
    Factory factory;
    // The store prefix of the NCCL side within the group's store.
    std::string storePrefix = "tuned-nccl/";
  };

  NcclSide(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options options);

  // Whether a CUDA backend can be made at all: a factory was given, or this build has NCCL.
  bool available() const { return options_.factory || ncclBuildInfo().compiledIn; }

  // The backend, created on first use. `device` is the group's bound device (init_process_group(device_id=...)) or
  // the device torch binds it to; `groupDesc` the group's description (c10d sets it on the group's backends without
  // a virtual call, so it is handed over at creation). Errors (no NCCL in this build, shut down already, the
  // factory's own) are c10::Errors without op and rank: the caller puts those in front.
  c10d::Backend& get(const std::optional<at::Device>& device, const std::string& groupDesc);
  // The backend if it was created, else null.
  c10::intrusive_ptr<c10d::Backend> existing() const;
  // Takes a backend made elsewhere (the parent's CUDA side shrunk for a new group) as this side's backend.
  void adopt(c10::intrusive_ptr<c10d::Backend> backend);
  // Runs `configure` on the backend now if it exists, else right after its creation (hooks registered on the group
  // before its first CUDA call). `configure` handles its own failures.
  void whenCreated(std::function<void(c10d::Backend&)> configure);

  void setTimeout(std::chrono::milliseconds timeout);
  void setGroupUid(const std::string& uid);
  // The group's new members (TunedBackend::reconfigure): the ProcessGroupNCCL, not created yet, will be made for
  // them at their first CUDA call; the side opens again if it was closed. Refused once it exists.
  void rebind(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  void abort();
  void shutdown();

 private:
  void close(void (c10d::Backend::*action)());

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  Options options_;
  std::string groupUid_;
  mutable std::mutex mutex_;
  // Held while a backend is being made (the factory may take the GIL), never together with mutex_ the other way
  // round: two threads' first CUDA calls make one backend.
  std::mutex createMutex_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  bool closed_ = false;  // after abort()/shutdown(): no new backend, nothing forwarded again
  std::vector<std::function<void(c10d::Backend&)>> pendingConfigure_;
};

// The C++ choice (nccl_factory.cpp, only in builds with NCCL): what "nccl" means in the torch this was built
// against, as torch's own registrar decides: c10d::nccl2::ProcessGroupNCCL on torch 2.15 unless TORCH_DIST_USE_NCCL2=0,
// on torch 2.14 only with TORCH_DIST_USE_NCCL2=1; else the classic c10d::ProcessGroupNCCL.
c10::intrusive_ptr<c10d::Backend> createNcclBackend(const NcclSide::CreateArgs& args);

}  // namespace tunedist::cuda
