// The environment: every TUNEDIST_* variable the C++ code reads goes through these two functions, so each is
// parsed the same way and a bad value fails with one kind of message that names the variable.
#pragma once

#include <optional>
#include <string>

namespace tunedist::core {

// The variable's value; nullopt when it is unset or empty.
std::optional<std::string> envString(const char* name);
// The variable as a non-negative integer; nullopt when unset or empty. Throws tunedist::core::Error naming the variable
// when it is set to anything else.
std::optional<long long> envNonNegativeInt(const char* name);

}  // namespace tunedist::core
