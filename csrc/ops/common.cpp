// Group lookup and reduce-op names for the torch.ops.tunedist.* collectives.
#include "ops/common.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <array>
#include <utility>

namespace tunedist::ops {

c10::intrusive_ptr<c10d::Backend> backendFor(const char* op, const std::string& groupName, c10::DeviceType device) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(groupName);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, op, ": no process group is registered under the name '", groupName,
                "' in this process (pass group.group_name of a live group, as the tunedist.* functions do): ",
                e.what_without_backtrace());
  }
  return group->getBackend(device);
}

c10::intrusive_ptr<c10d::Backend> backendFor(const char* op, const GroupPtr& group, c10::DeviceType device) {
  TORCH_CHECK(group, op, ": the process group is None; pass a live group (or its group_name)");
  return group->getBackend(device);
}

void waitFor(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) {
    work->wait();
  }
}

c10d::ReduceOp parseReduceOp(const char* op, const std::string& name) {
  static const std::array<std::pair<const char*, c10d::ReduceOp::RedOpType>, 8> kOps{{
      {"sum", c10d::ReduceOp::SUM},
      {"avg", c10d::ReduceOp::AVG},
      {"product", c10d::ReduceOp::PRODUCT},
      {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX},
      {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR},
      {"bxor", c10d::ReduceOp::BXOR},
  }};
  for (const auto& [text, value] : kOps) {
    if (name == text) {
      return c10d::ReduceOp(value);
    }
  }
  TORCH_CHECK(false, op, ": unknown reduce op '", name,
              "'; use sum, avg, product, min, max, band, bor or bxor (PREMUL_SUM: use torch.distributed)");
}

}  // namespace tunedist::ops
