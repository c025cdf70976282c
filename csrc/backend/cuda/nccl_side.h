// NcclSide: the CUDA half of a TunedBackend. When a group maps both `cpu` and `cuda` to `tuned`, torch creates one
// backend object for both device types; TunedBackend sends each call with CUDA tensors here, and this wraps torch's
// own c10d::ProcessGroupNCCL, so stream semantics, CUDA futures, error handling and the watchdog are torch's.
//
// The ProcessGroupNCCL is created at the first CUDA call (a CPU-only job never touches CUDA or NCCL), from a
// PrefixStore of the group's store under its own prefix, with the group's timeout. abort, shutdown and setTimeout
// are forwarded to it once it exists. In a build without NCCL (TUNEDIST_USE_NCCL=OFF) every CUDA call fails with a
// message that names the op, the rank and the ways out.
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
  // Called once, right after the ProcessGroupNCCL is created (not under any lock): the Python module logs what
  // NCCL will use there.
  using CreatedHook = std::function<void(int rank, int size)>;

  struct Options {
    std::chrono::milliseconds timeout = kDefaultTimeout;
    CreatedHook onCreated;
    // The store prefix of the NCCL side within the group's store.
    std::string storePrefix = "tuned-nccl/";
  };

  NcclSide(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options options);

  // The ProcessGroupNCCL, created on first use. `boundDevice` is the group's bound device
  // (init_process_group(device_id=...)), handed to it at creation. Errors (no NCCL in this build, shut down
  // already) are c10::Errors without op and rank: the caller puts those in front.
  c10d::Backend& get(const std::optional<at::Device>& boundDevice);
  // The ProcessGroupNCCL if it was created, else null.
  c10::intrusive_ptr<c10d::Backend> existing() const;
  // Runs `configure` on the ProcessGroupNCCL now if it exists, else right after its creation (hooks registered on
  // the group before its first CUDA call). `configure` handles its own failures.
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
  c10::intrusive_ptr<c10d::Backend> backend_;
  bool closed_ = false;  // after abort()/shutdown(): no new ProcessGroupNCCL, nothing forwarded again
  std::vector<std::function<void(c10d::Backend&)>> pendingConfigure_;
};

// Implemented in nccl_factory.cpp, which exists only in builds with NCCL.
c10::intrusive_ptr<c10d::Backend> createNcclBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, const std::string& groupUid,
                                                    const std::optional<at::Device>& boundDevice);

}  // namespace tunedist::cuda
