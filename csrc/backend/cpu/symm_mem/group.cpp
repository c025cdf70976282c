#include "backend/cpu/symm_mem/group.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "backend/tuned_backend.h"

namespace tunedist::cpu::symm_mem {

TunedGroup resolveTunedGroup(const char* op, const std::optional<std::string>& groupName) {
  TunedGroup g;
  // torch names the default group "0" (its symm_mem rendezvous falls back to that name too).
  g.name = groupName.value_or("0");
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(g.name);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tunedist: ", op, ": no process group named '", g.name, "'",
                groupName ? "" : " (the default group: call dist.init_process_group('tuned') first)", ": ", e.what());
  }
  try {
    g.backend = pg->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tunedist: ", op, ": process group '", g.name,
                "' has no CPU backend; CPU symmetric memory comes from a group with backend 'tuned' (or "
                "'cpu:tuned,cuda:nccl'): ",
                e.what());
  }
  g.tuned = dynamic_cast<TunedBackend*>(g.backend.get());
  TORCH_CHECK(g.tuned != nullptr, "tunedist: ", op, ": process group '", g.name, "' runs CPU tensors on '",
              g.backend->getBackendName(),
              "', not 'tuned': CPU symmetric memory comes from a tuned group's "
              "symmetric heap (init_process_group('tuned') or new_group(backend='tuned'))");
  return g;
}

}  // namespace tunedist::cpu::symm_mem
