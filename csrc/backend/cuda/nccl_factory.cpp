// Creates the NCCL side's backend in C++, for groups made without Python's factory (tunedist::createBackend from a
// LibTorch program). Compiled only with TUNEDIST_USE_NCCL (see cmake/tunedistNccl.cmake): it is the one file that
// includes ProcessGroupNCCL.hpp and so needs nccl.h and the CUDA runtime headers.
//
// It makes what "nccl" means in the torch it was built against, as torch's registrar decides it
// (_register_builtin_nccl_backend in distributed_c10d.py): where Backend.hpp's torch has nccl2
// (TUNEDIST_C10D_HAS_NCCL2) that is c10d::nccl2::ProcessGroupNCCL unless TORCH_DIST_USE_NCCL2=0 on torch 2.15
// (TUNEDIST_C10D_NCCL2_BY_DEFAULT), and only with TORCH_DIST_USE_NCCL2=1 on torch 2.14; else the classic
// c10d::ProcessGroupNCCL. NCCL settings are left to torch and NCCL: nothing here sets an environment
// variable or an NCCL config field.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#ifdef TUNEDIST_C10D_HAS_NCCL2
#include <torch/csrc/distributed/c10d/nccl2/ProcessGroupNCCL.hpp>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

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

// ProcessGroupNCCL::Options (nccl2 takes the same class) embeds ncclConfig_t, which grows between NCCL releases.
// tunedist allocates the Options (Options::create is inline), so its nccl.h must match the one torch compiled against
// in major.minor, or torch's constructor would write past the allocation.
void checkHeaderMatchesTorch() {
  const NcclVersion torchVersion = NcclVersion::unpack(torch::cuda::nccl::version());
  TORCH_CHECK(torchVersion.major == kHeaderVersion.major && torchVersion.minor == kHeaderVersion.minor,
              "this tunedist was compiled against nccl.h ", kHeaderVersion.str(), " but torch was built with NCCL ",
              torchVersion.str(),
              "; their ProcessGroupNCCL layouts may differ. Rebuild tunedist with the nccl.h of torch's NCCL "
              "(the nvidia-nccl pip package next to torch, or -DTUNEDIST_NCCL_INCLUDE_DIR=...), or use "
              "init_process_group(\"cpu:tuned,cuda:nccl\").");
}

c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options> optionsFor(const NcclSide::CreateArgs& args) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = args.timeout;
  options->group_name = args.groupUid;
  return options;
}

c10::intrusive_ptr<c10d::Backend> createClassic(const NcclSide::CreateArgs& args) {
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(args.store, args.rank, args.size, optionsFor(args));
  if (!args.groupUid.empty()) {
    backend->setGroupUid(args.groupUid);
  }
  if (args.device.has_value()) {
    backend->setBoundDeviceId(args.device);
  }
  return backend;
}

#ifdef TUNEDIST_C10D_HAS_NCCL2
// torch's _nccl2_device: the bound device, else LOCAL_RANK modulo the visible devices, else the rank modulo them.
// Counted with CUDA's own call first: nccl2's constructor and c10::cuda::device_count() are noexcept paths that end
// the process where there is no driver, and a machine without a GPU must get an error it can catch.
at::Device nccl2Device(const NcclSide::CreateArgs& args) {
  int count = 0;
  const cudaError_t err = c10::cuda::GetDeviceCount(&count);
  TORCH_CHECK(err == cudaSuccess && count > 0,
              "nccl2 requires at least one CUDA device, and this machine has no usable GPU (cudaGetDeviceCount: ",
              cudaGetErrorString(err), ")");
  if (args.device.has_value()) {
    return *args.device;
  }
  const char* localRank = std::getenv("LOCAL_RANK");
  const int index = (localRank != nullptr ? std::atoi(localRank) : args.rank) % count;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

c10::intrusive_ptr<c10d::Backend> createNccl2(const NcclSide::CreateArgs& args) {
  const at::Device device = nccl2Device(args);
  auto backend = c10::make_intrusive<c10d::nccl2::ProcessGroupNCCL>(args.store, args.rank, args.size, optionsFor(args));
  if (!args.groupUid.empty()) {
    backend->setGroupUid(args.groupUid);
  }
  // nccl2 makes its communicator when it is bound to a device.
  backend->setBoundDeviceId(device);
  return backend;
}
#endif

}  // namespace

NcclBuildInfo ncclBuildInfo() {
  return NcclBuildInfo{true, kHeaderVersion.str(), NcclVersion::unpack(torch::cuda::nccl::version()).str()};
}

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const NcclSide::CreateArgs& args) {
  checkHeaderMatchesTorch();
#ifdef TUNEDIST_C10D_HAS_NCCL2
  const char* useNccl2 = std::getenv("TORCH_DIST_USE_NCCL2");
#ifdef TUNEDIST_C10D_NCCL2_BY_DEFAULT
  if (useNccl2 == nullptr || std::strcmp(useNccl2, "0") != 0) {
    return createNccl2(args);
  }
#else
  if (useNccl2 != nullptr && std::strcmp(useNccl2, "1") == 0) {
    return createNccl2(args);
  }
#endif
#endif
  return createClassic(args);
}

}  // namespace tunedist::cuda
