// Binds tunedist._C._hooks (hooks_bindings.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace tunedist {
void bindHooks(pybind11::module& m);
}
