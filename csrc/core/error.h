// Error reporting for the shared-memory engine. The engine does not include torch headers, so it has its own
// exception type; the backend lets it propagate (pybind maps it to RuntimeError) and c10d stores it in the Work.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tunedist::core {

// Thrown for every engine failure: a caller error, a peer failure, a timeout or an OS error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown when a peer rank was found dead, so callers can tell it from other failures.
class PeerDeadError : public Error {
 public:
  using Error::Error;
};

// Thrown when an operation ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// What kind of failure an Error is. It travels with an abort to the peers, so a peer that learns of a timeout or a
// dead rank through the group's abort word throws the same type as the rank that found it.
enum class FailureKind : int32_t { kError = 0, kTimeout = 1, kPeerDead = 2 };

inline FailureKind failureKindOf(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) return FailureKind::kTimeout;
  if (dynamic_cast<const PeerDeadError*>(&e) != nullptr) return FailureKind::kPeerDead;
  return FailureKind::kError;
}

[[noreturn]] inline void throwFailure(FailureKind kind, const std::string& what) {
  switch (kind) {
    case FailureKind::kTimeout: throw TimeoutError(what);
    case FailureKind::kPeerDead: throw PeerDeadError(what);
    default: throw Error(what);
  }
}

namespace detail {
inline void streamAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void streamAll(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  streamAll(os, rest...);
}
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  streamAll(os, args...);
  return os.str();
}
}  // namespace detail
}  // namespace tunedist::core

// TD_CHECK(cond, parts...): throw tunedist::core::Error with the parts concatenated when cond is false.
#define TD_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) {                                                               \
      throw ::tunedist::core::Error(::tunedist::core::detail::str(__VA_ARGS__)); \
    }                                                                            \
  } while (0)

// TD_ASSERT: our own invariant; names the file and line because it is a bug in tunedist if it fires.
#define TD_ASSERT(cond, ...)                                                                                    \
  do {                                                                                                          \
    if (!(cond)) {                                                                                              \
      throw ::tunedist::core::Error(::tunedist::core::detail::str("tunedist internal error at ", __FILE__, ":", \
                                                                  __LINE__, ": ", #cond, " ", ##__VA_ARGS__));  \
    }                                                                                                           \
  } while (0)
