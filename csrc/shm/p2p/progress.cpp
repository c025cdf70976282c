#include "shm/p2p/progress.h"

#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace tunedist::shm::p2p {
namespace {

constexpr std::chrono::milliseconds kPeerCheckInterval{10};
// Each rendezvous poll is a store round trip (c10d's TCPStore), so a pass makes only a few.
constexpr int kMaxPollsPerPass = 4;
// How long a destroyed engine waits for receivers to map rings that still hold messages they have not seen.
constexpr std::chrono::milliseconds kLinger{3000};

}  // namespace

Progress::Progress(const Context& ctx, int size) : ctx_(ctx), matcher_(ctx.rank, size) {
  out_.reserve(size_t(size));
  in_.reserve(size_t(size));
  for (int peer = 0; peer < size; ++peer) {
    out_.emplace_back(ctx_, peer);
    in_.emplace_back(ctx_, matcher_, peer);
  }
}

void Progress::post(OpPtr op) {
  if (op->isSend) {
    out_[size_t(op->peer)].post(std::move(op));
  } else {
    postReceive(std::move(op));
  }
}

void Progress::postReceive(OpPtr op) {
  // Step 1 of a receive (recv_channel.h).
  auto report = [this](int src, const std::string& text) { in_[size_t(src)].reportToSender(text); };
  if (matcher_.takeUnexpected(op, report)) {
    return;
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    bool relevant = op->peer == int(src) || (op->peer < 0 && int(src) != ctx_.rank);
    if (relevant && !in_[src].admit(op)) {
      return;
    }
  }
  // Step 2.
  matcher_.post(std::move(op));
}

bool Progress::pass(Clock::time_point now) {
  matcher_.updateWanted();
  bool moved = false;
  for (SendChannel& ch : out_) {
    if (ch.busy()) {
      moved = ch.pump() || moved;
    }
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    if (in_[src].active(matcher_.wants(int(src)))) {
      moved = in_[src].pump() || moved;
    }
  }
  moved = discover(now) || moved;
  expire(now);
  if (now >= nextPeerCheck_) {
    nextPeerCheck_ = now + kPeerCheckInterval;
    checkPeers(now);
  }
  return moved;
}

bool Progress::discover(Clock::time_point now) {
  bool moved = false;
  int polls = 0;
  // Round-robin from where the last pass stopped, so the rings already found keep flowing.
  for (size_t i = 0; i < in_.size() && polls < kMaxPollsPerPass; ++i) {
    const size_t s = (discoverCursor_ + i) % in_.size();
    if (!in_[s].pollDue(now, matcher_.wants(int(s)))) {
      continue;
    }
    ++polls;
    discoverCursor_ = s + 1;
    moved = in_[s].poll(now) || moved;
  }
  return moved;
}

void Progress::expire(Clock::time_point now) {
  for (SendChannel& ch : out_) {
    ch.expire(now);
  }
  matcher_.expirePosted(now, [this](const Op& op) { return receiveStall(op); });
  for (RecvChannel& ch : in_) {
    ch.expire(now);
  }
  matcher_.expireClaimed(now);
}

std::string Progress::receiveStall(const Op& op) const {
  if (op.peer < 0) {
    return core::detail::str("no message with tag ", op.tag, " arrived from any rank");
  }
  return in_[size_t(op.peer)].stall(op);
}

void Progress::checkPeers(Clock::time_point now) {
  for (SendChannel& ch : out_) {
    ch.checkPeer(now);
  }
  for (size_t src = 0; src < in_.size(); ++src) {
    in_[src].checkPeer(now, matcher_.wants(int(src)));
  }
}

bool Progress::hasPendingWork() const {
  auto sending = [](const SendChannel& ch) { return ch.busy(); };
  auto receiving = [](const RecvChannel& ch) { return ch.inMessage(); };
  return matcher_.hasPosted() || std::any_of(out_.begin(), out_.end(), sending) ||
         std::any_of(in_.begin(), in_.end(), receiving);
}

bool Progress::watch(BellSet& bells, Clock::time_point* until) const {
  bool ready = false;
  for (size_t dst = 0; dst < out_.size() && !ready; ++dst) {
    ready = out_[dst].watch(bells);
  }
  for (size_t src = 0; src < in_.size() && !ready; ++src) {
    ready = in_[src].watch(bells, matcher_.wants(int(src)), until);
  }
  *until = std::min(*until, earliestDeadline());
  if (bells.hasRings()) {
    *until = std::min(*until, nextPeerCheck_);
  }
  return ready;
}

Clock::time_point Progress::earliestDeadline() const {
  Clock::time_point t = matcher_.earliestDeadline();
  for (const SendChannel& ch : out_) {
    t = std::min(t, ch.earliestDeadline());
  }
  for (const RecvChannel& ch : in_) {
    t = std::min(t, ch.earliestDeadline());
  }
  return t;
}

void Progress::failAll(const std::string& reason) {
  for (SendChannel& ch : out_) {
    if (!ch.failed()) {
      ch.fail(reason, false);
    }
  }
  for (RecvChannel& ch : in_) {
    if (!ch.failed()) {
      ch.fail(reason, false, true);
    }
    ch.close();
  }
  matcher_.failAll(reason);
}

void Progress::close(const std::string& why, bool lingerForReceivers, std::vector<OpPtr> late) {
  for (OpPtr& op : late) {
    matcher_.post(std::move(op));
  }
  // Rings that hold complete messages their receiver has not seen (not those of a failed channel: what is in them
  // can never be finished).
  std::vector<const SendChannel*> unseen;
  for (const SendChannel& ch : out_) {
    if (lingerForReceivers && ch.holdsUnseen()) {
      unseen.push_back(&ch);
    }
  }
  failAll(why);
  // A send completes once its bytes are in the ring, so a receiver that has not mapped the ring yet would lose them
  // when we unlink the name. Give such receivers a moment (bounded: a receiver may never come).
  Clock::time_point until = Clock::now() + kLinger;
  while (std::any_of(unseen.begin(), unseen.end(), [](const SendChannel* ch) { return ch->receiverAbsent(); }) &&
         Clock::now() < until) {
    usleep(1000);
  }
}

}  // namespace tunedist::shm::p2p
