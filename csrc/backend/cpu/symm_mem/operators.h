// torch's symmetric-memory operators (torch.ops.symm_mem.*) for CPU tensors of a `tuned` group (operators.cpp says
// which, and how each runs). Registered at run time with the allocator (registerAllocator), not by a static
// initializer: a torch whose schema for one of them changed then loads tunedist with a warning for that operator.
#pragma once

#include <torch/library.h>

#include <memory>

namespace tunedist::cpu::symm_mem {

// The CPU kernels, registered for as long as the returned library lives.
std::unique_ptr<torch::Library> registerOperators();

}  // namespace tunedist::cpu::symm_mem
