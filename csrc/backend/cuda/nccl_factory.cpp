// Creates the NCCL side's c10d::ProcessGroupNCCL. Compiled only with TUNEDIST_USE_NCCL (see cmake/tunedistNccl.cmake):
// it is the one file that includes ProcessGroupNCCL.hpp and so needs nccl.h and the CUDA runtime headers.
//
// NCCL settings are left to torch and NCCL: torch turns asynchronous error handling on by default and NCCL detects
// P2P, InfiniBand and sockets itself; nothing here sets an environment variable or an NCCL config field.
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdint>

#include "backend/cuda/nccl_side.h"

namespace tunedist::cuda {
namespace {

// torch::cuda::nccl::version() packs the NCCL version torch was compiled with as major << 32 | minor << 16 | patch.
struct NcclVersion {
  uint64_t major, minor, patch;
  static NcclVersion unpack(uint64_t v) { return {v >> 32, (v >> 16) & 0xffff, v & 0xffff}; }
  std::string str() const { return c10::str(major, ".", minor, ".", patch); }
};

constexpr NcclVersion kHeaderVersion{NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH};

// ProcessGroupNCCL::Options embeds ncclConfig_t, which grows between NCCL releases. tunedist allocates the Options
// (Options::create is inline), so its nccl.h must match the one torch compiled against in major.minor, or torch's
// constructor would write past the allocation.
void checkHeaderMatchesTorch() {
  const NcclVersion torchVersion = NcclVersion::unpack(torch::cuda::nccl::version());
  TORCH_CHECK(torchVersion.major == kHeaderVersion.major && torchVersion.minor == kHeaderVersion.minor,
              "this tunedist was compiled against nccl.h ", kHeaderVersion.str(), " but torch was built with NCCL ",
              torchVersion.str(),
              "; their ProcessGroupNCCL layouts may differ. Rebuild tunedist with the nccl.h of torch's NCCL "
              "(the nvidia-nccl pip package next to torch, or -DTUNEDIST_NCCL_INCLUDE_DIR=...), or use "
              "init_process_group(\"cpu:tuned,cuda:nccl\").");
}

}  // namespace

NcclBuildInfo ncclBuildInfo() {
  return NcclBuildInfo{true, kHeaderVersion.str(), NcclVersion::unpack(torch::cuda::nccl::version()).str()};
}

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, const std::string& groupUid,
                                                    const std::optional<at::Device>& boundDevice) {
  checkHeaderMatchesTorch();
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  options->group_name = groupUid;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  // As torch's own group creation does for NCCL: number the group's collectives from the start (flight recorder,
  // desync debugging).
  backend->setSequenceNumberForGroup();
  if (!groupUid.empty()) {
    backend->setGroupUid(groupUid);
  }
  if (boundDevice.has_value() && boundDevice->is_cuda() && boundDevice->has_index()) {
    backend->setBoundDeviceId(boundDevice);
  }
  return backend;
}

}  // namespace tunedist::cuda
