// What every torch.ops.tunedist.* collective shares: the group named as torch's functional collectives name it
// (ProcessGroup.group_name), its backend for a device type, and reduce ops by name. See all_reduce.cpp for why these
// operators exist.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>

namespace tunedist::ops {

// The backend that torch.distributed would reach for `device` tensors on the group registered as `groupName` (c10d's
// collective operators call the same). Throws, naming `op` and the group, where no live group has that name.
c10::intrusive_ptr<c10d::Backend> backendFor(const char* op, const std::string& groupName, c10::DeviceType device);
// The same for a group passed as the ProcessGroup object (the operators' `.group` overloads).
using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
c10::intrusive_ptr<c10d::Backend> backendFor(const char* op, const GroupPtr& group, c10::DeviceType device);

// Registers an operator's kernel for a group by name (`name`) and by object (`name.group`) on the CPU, CUDA and Meta
// dispatch keys; `Kernel<G>` is the kernel for group type G, `MetaKernel<G>` its shape-only twin.
#define TUNEDIST_IMPL_BOTH_GROUPS(name, Kernel, MetaKernel)       \
  TORCH_LIBRARY_IMPL(tunedist, CPU, m) {                          \
    m.impl(name, Kernel<std::string>);                            \
    m.impl(name ".group", Kernel<::tunedist::ops::GroupPtr>);     \
  }                                                               \
  TORCH_LIBRARY_IMPL(tunedist, CUDA, m) {                         \
    m.impl(name, Kernel<std::string>);                            \
    m.impl(name ".group", Kernel<::tunedist::ops::GroupPtr>);     \
  }                                                               \
  TORCH_LIBRARY_IMPL(tunedist, Meta, m) {                         \
    m.impl(name, MetaKernel<std::string>);                        \
    m.impl(name ".group", MetaKernel<::tunedist::ops::GroupPtr>); \
  }

// Waits for a collective the operator started synchronously: a tuned group returns no Work for a call it ran
// inline (cpu::Executor::Options::syncReturnsWork), other backends return one.
void waitFor(const c10::intrusive_ptr<c10d::Work>& work);

// "sum", "avg", "product", "min", "max", "band", "bor", "bxor"; anything else throws, naming `op`.
c10d::ReduceOp parseReduceOp(const char* op, const std::string& name);

}  // namespace tunedist::ops
