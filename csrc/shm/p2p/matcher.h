// Matcher: the posted receives against the messages that arrived before anybody wanted them (the unexpected
// queue), by (source, tag), any source included. A message goes to the first posted receive, in posting order,
// from its source (or any source) with its tag; a new receive first takes the first such unexpected message, in
// arrival order. Progress thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "shm/p2p/op.h"

namespace tunedist::shm::p2p {

// A message that arrived before any receive wanted it, kept on the heap.
struct Unexpected {
  int src = -1;
  int64_t tag = 0;
  size_t bytes = 0;
  std::unique_ptr<char[]> data;
  bool complete = false;
  bool dropped = false;  // taken by a receive of the wrong size: the rest of it is discarded
  OpPtr claimedBy;       // a receive that matched it while it was still streaming in
};

// The error text of a receive whose message has another size: names both sizes, tag and ranks.
std::string sizeMismatch(const Op& op, int rank, int src, int64_t tag, size_t sentBytes);

class Matcher {
 public:
  // An unexpected message, as the receive channel streaming it in holds it.
  using Arrival = std::list<Unexpected>::iterator;
  // Tells src's sender that a message it sent was rejected (RecvChannel::reportToSender).
  using Report = std::function<void(int src, const std::string& text)>;

  Matcher(int rank, int size) : rank_(rank), want_(size_t(size), 0) {}

  // A new receive, step 1: takes a complete unexpected message, or claims one still streaming in. A size mismatch
  // fails `op` (after `report`) and drops the message. False, with `op` untouched, when none matches.
  bool takeUnexpected(OpPtr& op, const Report& report);
  // A new receive, step 2: waits for a message, after those posted before it.
  void post(OpPtr op) { posted_.push_back(std::move(op)); }

  // Step 3, a message from `src` with `tag` arrived: the first posted receive that matches it, taken out of the
  // queue, or null. *wanted says whether any posted receive takes src's messages at all (tag aside).
  OpPtr match(int src, int64_t tag, bool* wanted);
  // Step 3, not matched: a new unexpected message, for its channel to stream in.
  Arrival arrive(int src, int64_t tag, size_t bytes);
  // Its last byte is in: completes the receive that claimed it, if any, or keeps it for a later one.
  void finish(Arrival message);
  // Its channel failed half-way: fails the receive that claimed it, if any, and forgets it.
  void abandon(Arrival message, const std::string& why, bool dead);

  // Recomputes wants() from the posted receives.
  void updateWanted();
  // Whether a posted receive could take src's next message.
  bool wants(int src) const { return want_[size_t(src)] != 0; }
  bool hasPosted() const { return !posted_.empty(); }
  Clock::time_point earliestDeadline() const;

  // Fails the posted receives from `src` (and the any-source ones when `anySourceToo`).
  void failFrom(int src, bool anySourceToo, const std::string& why, bool dead);
  // Fails the posted receives past their deadline; `stall` says what each was waiting for.
  void expirePosted(Clock::time_point now, const std::function<std::string(const Op&)>& stall);
  // Fails the receives past their deadline that wait for an unexpected message to finish streaming in.
  void expireClaimed(Clock::time_point now);
  // Fails every posted and claiming receive.
  void failAll(const std::string& reason);

 private:
  // Copies a complete message into its receive, forgets it and completes the receive.
  void deliver(Arrival message, OpPtr op);

  const int rank_;
  std::list<OpPtr> posted_;  // receives waiting for a message, in posting order
  std::list<Unexpected> unexpected_;
  std::vector<char> want_;  // want_[src]: a posted receive could take src's next message
};

}  // namespace tunedist::shm::p2p
