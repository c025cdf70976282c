#include "core/env.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace tunedist::core {

std::optional<std::string> envString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return std::nullopt;
  }
  return std::string(v);
}

std::optional<long long> envNonNegativeInt(const char* name) {
  auto text = envString(name);
  if (!text) {
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text->c_str(), &end, 10);
  TD_CHECK(errno == 0 && end != nullptr && *end == '\0' && parsed >= 0, "tunedist: environment variable ", name, "='",
           *text, "' is not a non-negative integer");
  return parsed;
}

}  // namespace tunedist::core
