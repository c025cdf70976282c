#include "shm/p2p/op.h"

#include <string>

#include "core/error.h"

namespace tunedist::shm::p2p {
namespace {

std::string withoutPrefix(const std::string& s) {
  static constexpr const char* kPrefix = "tunedist: ";
  return s.rfind(kPrefix, 0) == 0 ? s.substr(std::char_traits<char>::length(kPrefix)) : s;
}

long long msBetween(Clock::time_point a, Clock::time_point b) {
  return (long long)std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

}  // namespace

std::string describe(const Op& op, int rank) {
  if (op.isSend) {
    return core::detail::str("send to rank ", op.peer, " (tag ", op.tag, ", ", op.bytes, " bytes) on rank ", rank);
  }
  return core::detail::str("recv from ", op.peer < 0 ? std::string("any source") : core::detail::str("rank ", op.peer),
                           " (tag ", op.tag, ", ", op.bytes, " bytes) on rank ", rank);
}

std::exception_ptr channelError(const Op& op, int rank, const std::string& failure, bool dead) {
  std::string msg = core::detail::str("tunedist: ", describe(op, rank), " failed: ", failure);
  return dead ? errorOf<core::PeerDeadError>(msg) : errorOf<core::Error>(msg);
}

std::exception_ptr opError(const Op& op, int rank, const std::string& why, bool dead) {
  return channelError(op, rank, withoutPrefix(why), dead);
}

std::exception_ptr timeoutError(const Op& op, int rank, const std::string& why) {
  return errorOf<core::TimeoutError>(core::detail::str("tunedist: ", describe(op, rank), ": Timed out after ",
                                                       msBetween(op.posted, op.deadline), " ms: ", why));
}

void complete(OpPtr op, int srcRank) {
  P2pEngine::Done done = std::move(op->done);
  op.reset();
  try {
    done(nullptr, srcRank);
  } catch (...) {
    // Done must not throw; if it does, the progress thread (every other operation) matters more than its error.
  }
}

void fail(OpPtr op, std::exception_ptr error) {
  P2pEngine::Done done = std::move(op->done);
  int peer = op->peer;
  op.reset();
  try {
    // Moved, so that no reference stays on this thread once Done handed the error on.
    done(std::move(error), peer);
  } catch (...) {
    // As in complete().
  }
}

}  // namespace tunedist::shm::p2p
