// The `tuned` backend of a process group named as torch's symmetric-memory API names it (a group name string),
// for the allocator and the symm_mem operators.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <optional>
#include <string>

namespace tunedist {
class TunedBackend;
}  // namespace tunedist

namespace tunedist::cpu::symm_mem {

struct TunedGroup {
  std::string name;
  c10::intrusive_ptr<c10d::Backend> backend;  // the group's CPU backend
  TunedBackend* tuned = nullptr;              // the same object
};

// The group `groupName` (the default group, "0", when none) and its CPU backend, which must be `tuned`; throws
// naming `op`, the group and the fix otherwise.
TunedGroup resolveTunedGroup(const char* op, const std::optional<std::string>& groupName);

}  // namespace tunedist::cpu::symm_mem
