// DeviceScan: which device types one call's tensors live on, so TunedBackend can send the call to its CPU side
// (shared memory) or its NCCL side. Every collective entry point scans its inputs and outputs first.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

namespace tunedist::cuda {

struct DeviceScan {
  bool cpu = false;
  bool cuda = false;

  void add(const at::Tensor& t) {
    if (t.defined()) {
      add(t.device());
    }
  }
  void add(const std::vector<at::Tensor>& ts) {
    for (const auto& t : ts) {
      add(t);
    }
  }
  void add(const std::vector<std::vector<at::Tensor>>& lists) {
    for (const auto& l : lists) {
      add(l);
    }
  }
  // A barrier names its device instead of passing tensors (BarrierOptions::device).
  void add(const std::optional<at::Device>& device) {
    if (device.has_value()) {
      add(*device);
    }
  }
  // Other device types (meta, ...) count as neither: the CPU side's checks reject them by name.
  void add(const at::Device& device) {
    cpu = cpu || device.is_cpu();
    cuda = cuda || device.is_cuda();
  }
};

}  // namespace tunedist::cuda
