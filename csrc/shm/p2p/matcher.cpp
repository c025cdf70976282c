#include "shm/p2p/matcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tunedist::shm::p2p {
std::string sizeMismatch(const Op& op, int rank, int src, int64_t tag, size_t sentBytes) {
  return core::detail::str("tunedist: recv on rank ", rank, " from rank ", src,
                           op.peer < 0 ? " (any-source receive)" : "", " (tag ", tag, "): size mismatch: rank ", src,
                           " sent ", sentBytes, " bytes but the receive expects ", op.bytes,
                           " bytes; the message was dropped. A send and its matching receive must use tensors of the "
                           "same size (numel x element size).");
}

bool Matcher::takeUnexpected(OpPtr& op, const Report& report) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    Unexpected& u = *it;
    if (u.dropped || u.claimedBy != nullptr || u.tag != op->tag || (op->peer >= 0 && op->peer != u.src)) {
      continue;
    }
    if (u.bytes != op->bytes) {
      std::string msg = sizeMismatch(*op, rank_, u.src, u.tag, u.bytes);
      report(u.src, msg);
      if (u.complete) {
        unexpected_.erase(it);
      } else {
        u.dropped = true;  // its channel keeps consuming the rest and then erases it
        u.data.reset();
      }
      fail(std::move(op), errorOf<core::Error>(msg));
      return true;
    }
    if (!u.complete) {
      u.claimedBy = std::move(op);
      return true;
    }
    deliver(it, std::move(op));
    return true;
  }
  return false;
}

OpPtr Matcher::match(int src, int64_t tag, bool* wanted) {
  *wanted = false;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->peer == src || (*it)->peer < 0) {
      *wanted = true;
      if ((*it)->tag == tag) {
        OpPtr op = std::move(*it);
        posted_.erase(it);
        return op;
      }
    }
  }
  return nullptr;
}

Matcher::Arrival Matcher::arrive(int src, int64_t tag, size_t bytes) {
  Unexpected& u = unexpected_.emplace_back();
  u.src = src;
  u.tag = tag;
  u.bytes = bytes;
  u.data.reset(new char[std::max<size_t>(u.bytes, 1)]);
  return std::prev(unexpected_.end());
}

void Matcher::finish(Arrival message) {
  Unexpected& u = *message;
  u.complete = true;
  if (u.dropped) {
    unexpected_.erase(message);
  } else if (u.claimedBy != nullptr) {
    deliver(message, std::move(u.claimedBy));
  }
}

void Matcher::deliver(Arrival message, OpPtr op) {
  if (message->bytes > 0) {
    std::memcpy(op->data, message->data.get(), message->bytes);
  }
  int src = message->src;
  unexpected_.erase(message);
  complete(std::move(op), src);
}

void Matcher::abandon(Arrival message, const std::string& why, bool dead) {
  if (message->claimedBy != nullptr) {
    OpPtr op = std::move(message->claimedBy);
    std::exception_ptr error = opError(*op, rank_, why, dead);
    fail(std::move(op), std::move(error));
  }
  unexpected_.erase(message);
}

void Matcher::updateWanted() {
  std::fill(want_.begin(), want_.end(), 0);
  for (const OpPtr& op : posted_) {
    if (op->peer >= 0) {
      want_[size_t(op->peer)] = 1;
    } else {
      std::fill(want_.begin(), want_.end(), 1);
      want_[size_t(rank_)] = 0;
      return;
    }
  }
}

Clock::time_point Matcher::earliestDeadline() const {
  Clock::time_point t = Clock::time_point::max();
  for (const OpPtr& op : posted_) {
    t = std::min(t, op->deadline);
  }
  for (const Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr) {
      t = std::min(t, u.claimedBy->deadline);
    }
  }
  return t;
}

void Matcher::failFrom(int src, bool anySourceToo, const std::string& why, bool dead) {
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == src || (anySourceToo && (*it)->peer < 0)) {
      OpPtr op = std::move(*it);
      it = posted_.erase(it);
      std::exception_ptr error = opError(*op, rank_, why, dead);
      fail(std::move(op), std::move(error));
    } else {
      ++it;
    }
  }
}

void Matcher::expirePosted(Clock::time_point now, const std::function<std::string(const Op&)>& stall) {
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->deadline > now) {
      ++it;
      continue;
    }
    OpPtr op = std::move(*it);
    it = posted_.erase(it);
    std::exception_ptr error = timeoutError(*op, rank_, stall(*op));
    fail(std::move(op), std::move(error));
  }
}

void Matcher::expireClaimed(Clock::time_point now) {
  for (Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr && u.claimedBy->deadline <= now) {
      OpPtr op = std::move(u.claimedBy);
      std::exception_ptr error = timeoutError(*op, rank_,
                                              core::detail::str("the matching message from rank ", u.src,
                                                                " stopped arriving"));
      fail(std::move(op), std::move(error));
    }
  }
}

void Matcher::failAll(const std::string& reason) {
  for (auto it = posted_.begin(); it != posted_.end(); it = posted_.erase(it)) {
    OpPtr op = std::move(*it);
    std::exception_ptr error = opError(*op, rank_, reason, false);
    fail(std::move(op), std::move(error));
  }
  for (Unexpected& u : unexpected_) {
    if (u.claimedBy != nullptr) {
      OpPtr op = std::move(u.claimedBy);
      std::exception_ptr error = opError(*op, rank_, reason, false);
      fail(std::move(op), std::move(error));
    }
  }
}

}  // namespace tunedist::shm::p2p
