// Binds tunedist._C._hooks (hooks_bindings.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace tunedist::python {
void bindHooks(pybind11::module& m);
}
