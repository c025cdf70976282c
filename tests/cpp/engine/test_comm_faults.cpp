// Failures: ranks that disagree on an operation, a rank that never calls (timeout), abort(), and a peer whose
// heartbeat stops. Every rank must fail with a message that names the cause, and the group must stay failed.
// Deadlines are short where the test expects a failure, so a broken detector fails the test instead of hanging
// it; nothing asserts how fast a failure is found beyond "before the deadline".
#include <catch2/catch.hpp>

#include <atomic>

#include "shm_test_util.h"

namespace tunedist::test {
namespace {

// The next call on a failed communicator fails at once with the earlier cause, and with its exception type.
// `first` is the original failure (default: a plain Error, as from a mismatch or abort()).
void expectStaysFailed(Peer& p, const std::string& what, const std::string& cause, const Caught& first = Caught{}) {
  Caught again = catchError([&] { p.comm.barrier(p.op("barrier", Ms(2000))); });
  expectError(again, what + " (next call)", p.rank(), {"earlier failure", cause});
  if (again.timeout != first.timeout || again.dead != first.dead) {
    failCheck("rank ", p.rank(), ": the next call threw another exception type than the failure: ", again.message);
  }
}

// A waiter times out itself, or, with more than two ranks, may first learn of another waiter's timeout through the
// group's abort word; either way it throws TimeoutError, since the abort word carries the failure's kind.
void expectTimeout(const Caught& c, int rank) {
  if (!c.timeout) {
    failCheck("rank ", rank, " threw ", c.dead ? "PeerDeadError" : "a plain Error",
              ", expected TimeoutError: ", c.message);
  }
}

void waitFor(const std::atomic<int>& counter, int value, const char* what) {
  const auto limit = Clock::now() + kOpTimeout;
  while (counter.load() < value) {
    if (Clock::now() > limit) {
      failCheck("gave up waiting for ", what);
    }
    std::this_thread::sleep_for(Ms(1));
  }
}

// A mismatch: `odd` is true on the last rank only, which calls something the others do not.
struct Mismatch {
  const char* name;
  std::vector<std::string> mustName;  // op names the message must hold
  std::function<void(Peer&, bool odd, const OpContext&)> call;
};

std::vector<Mismatch> mismatches() {
  // Buffers are the calls' own; their contents do not matter.
  auto allreduce = [](size_t n, ReduceArgs a) {
    return [n, a](Peer& p, bool, const OpContext& ctx) {
      std::vector<float> in(n), out(n);
      p.comm.allreduce(ctx, in.data(), out.data(), n, a);
    };
  };
  ReduceArgs i32 = floatSum(), max = floatSum(), premulHalf = floatSum(), premulQuarter = floatSum();
  i32.dtype = DType::kInt32;
  max.op = RedOp::kMax;
  premulHalf.op = premulQuarter.op = RedOp::kPremulSum;
  premulHalf.factor = 0.5;
  premulQuarter.factor = 0.25;
  auto either = [](auto a, auto b) {
    return [a, b](Peer& p, bool odd, const OpContext& ctx) { odd ? b(p, odd, ctx) : a(p, odd, ctx); };
  };
  auto broadcast = [](int root) {
    return [root](Peer& p, bool, const OpContext& ctx) {
      std::vector<uint8_t> buf(64);
      p.comm.broadcast(ctx, buf.data(), buf.size(), root);
    };
  };
  auto reduce = [](int root) {
    return [root](Peer& p, bool, const OpContext& ctx) {
      std::vector<float> in(16), out(16);
      p.comm.reduce(ctx, in.data(), out.data(), in.size(), floatSum(), root);
    };
  };
  auto barrier = [](Peer& p, bool, const OpContext& ctx) { p.comm.barrier(ctx); };
  return {
      {"op", {"all_reduce", "broadcast"}, either(allreduce(8, floatSum()), broadcast(0))},
      {"op", {"barrier", "all_reduce"}, either(barrier, allreduce(8, floatSum()))},
      {"count", {"all_reduce"}, either(allreduce(8, floatSum()), allreduce(9, floatSum()))},
      {"count across algorithms", {"all_reduce"}, either(allreduce(8, floatSum()), allreduce(3000, floatSum()))},
      {"dtype", {"all_reduce", "float32", "int32"}, either(allreduce(8, floatSum()), allreduce(8, i32))},
      {"redop", {"all_reduce"}, either(allreduce(8, floatSum()), allreduce(8, max))},
      {"premul factor", {"all_reduce"}, either(allreduce(8, premulHalf), allreduce(8, premulQuarter))},
      {"broadcast root", {"broadcast", "root 0", "root 1"}, either(broadcast(0), broadcast(1))},
      {"reduce root", {"reduce", "root 0", "root 1"}, either(reduce(0), reduce(1))},
  };
}

// all_to_all: the last rank sends 16 bytes to rank 0, which expects 8 like from everybody.
void alltoallSplitMismatch(Peer& p, bool odd, const OpContext& ctx) {
  const size_t size = size_t(p.size());
  std::vector<uint8_t> send(16 * size), recv(16 * size);
  std::vector<size_t> sendBytes(size, 8), recvBytes(size, 8);
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  for (size_t q = 0; q < size; ++q) {
    sends.push_back(send.data() + 16 * q);
    recvs.push_back(recv.data() + 16 * q);
  }
  if (odd) {
    sendBytes[0] = 16;
  }
  p.comm.alltoallv(ctx, sends.data(), sendBytes.data(), recvs.data(), recvBytes.data());
}

}  // namespace

TEST_CASE("ranks that disagree on an operation all fail naming it, and the group stays failed",
          "[shm][faults][mismatch]") {
  const int size = GENERATE(2, 3);
  const bool attachedBefore = GENERATE(false, true);
  auto cases = mismatches();
  cases.push_back({"all_to_all splits", {"all_to_all", "split sizes"}, alltoallSplitMismatch});
  for (const Mismatch& m : cases) {
    INFO("mismatch of " << m.name << ", world size " << size << (attachedBefore ? ", after a barrier" : ""));
    ShmLeakCheck leaks;
    auto errors = runGroupCollect(size, smallOptions(), [&](Peer& p) {
      if (attachedBefore) {
        p.comm.barrier(p.op("barrier"));
      }
      const bool odd = p.rank() == p.size() - 1;
      const char* opName = m.mustName.front().c_str();
      Caught c = catchError([&] { m.call(p, odd, p.op(opName, Ms(3000))); });
      std::vector<std::string> parts{"disagree"};
      parts.insert(parts.end(), m.mustName.begin(), m.mustName.end());
      const std::string what = core::detail::str("mismatch of ", m.name);
      expectError(c, what, p.rank(), parts);
      expectStaysFailed(p, what, "disagree");
    });
    rethrowFailures(errors);
    CHECK(leaks.report() == "");
  }
}

TEST_CASE("a rank that never calls makes the others time out naming it", "[shm][faults][timeout]") {
  const int size = GENERATE(2, 3);
  const Ms deadline{300};
  INFO("world size " << size);
  ShmLeakCheck leaks;
  std::atomic<int> failedRanks{0};
  std::atomic<int> timeouts{0};
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    p.comm.barrier(p.op("barrier"));
    if (p.rank() == 1) {
      // Join only after the others gave up: the group's failure must reach us within two calls.
      waitFor(failedRanks, size - 1, "the other ranks to time out");
      Caught c = catchError([&] { p.comm.barrier(p.op("barrier", Ms(5000))); });
      if (!c.threw) {
        c = catchError([&] { p.comm.barrier(p.op("barrier", Ms(5000))); });
      }
      expectError(c, "late rank", p.rank(), {"aborted"});
      return;
    }
    const auto start = Clock::now();
    Caught c = catchError([&] { p.comm.barrier(p.op("barrier", deadline)); });
    failedRanks.fetch_add(1);
    expectError(c, "timeout", p.rank(), {"ranks [1]"});
    timeouts.fetch_add(c.message.find("aborted the group") == std::string::npos ? 1 : 0);
    expectTimeout(c, p.rank());
    if (c.at - start < deadline && c.message.find("aborted the group") == std::string::npos) {
      failCheck("rank ", p.rank(), " timed out before its deadline: ", c.message);
    }
    expectStaysFailed(p, "timeout", "ranks [1]", c);
  }));
  CHECK(timeouts.load() >= 1);
  CHECK(leaks.report() == "");
}

TEST_CASE("a rank that never attaches makes the others time out naming it", "[shm][faults][timeout]") {
  const int size = GENERATE(2, 3);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  const int missing = size - 1;
  std::atomic<int> timeouts{0};
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    if (p.rank() == missing) {
      return;
    }
    Caught c = catchError([&] { p.comm.barrier(p.op("barrier", Ms(300))); });
    expectError(c, "attach timeout", p.rank(), {core::detail::str("[", missing, "]"), "never attached"});
    timeouts.fetch_add(c.timeout ? 1 : 0);
    expectTimeout(c, p.rank());
    expectStaysFailed(p, "attach timeout", "never attached", c);
  }));
  CHECK(timeouts.load() >= 1);
  CHECK(leaks.report() == "");
}

TEST_CASE("abort() by one rank wakes the waiters with its reason", "[shm][faults][abort]") {
  const int size = GENERATE(2, 3);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    p.comm.barrier(p.op("barrier"));
    if (p.rank() == 1) {
      std::this_thread::sleep_for(Ms(50));  // usually the others are asleep in the barrier by now
      p.comm.abort("x-test-reason");
      expectStaysFailed(p, "aborting rank", "x-test-reason");
      return;
    }
    const auto deadline = Clock::now() + kOpTimeout;
    Caught c = catchError([&] { p.comm.barrier(p.op("barrier", kOpTimeout)); });
    expectError(c, "abort", p.rank(), {"aborted", "rank 1", "x-test-reason"});
    if (c.at >= deadline) {
      failCheck("rank ", p.rank(), " saw the abort only at its deadline: ", c.message);
    }
    expectStaysFailed(p, "abort", "x-test-reason");
  }));
  CHECK(leaks.report() == "");
}

// The watchdog case: abort() runs on another thread than the op, which waits for a rank that never comes,
// either in a collective or still attaching the segment (the first op).
TEST_CASE("abort() from another thread ends the waits, also while the group is attaching", "[shm][faults][abort]") {
  const int size = GENERATE(2, 3);
  const bool attachedBefore = GENERATE(false, true);
  INFO("world size " << size << (attachedBefore ? ", after a barrier" : ", at the first op"));
  const int absent = size - 1;
  const int aborter = size - 2;
  ShmLeakCheck leaks;
  std::atomic<int> done{0};
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    if (attachedBefore) {
      p.comm.barrier(p.op("barrier"));
    }
    if (p.rank() == absent) {
      waitFor(done, size - 1, "the others' failure");
      return;
    }
    std::thread watchdog;
    if (p.rank() == aborter) {
      watchdog = std::thread([&] {
        std::this_thread::sleep_for(Ms(50));
        p.comm.abort("watchdog-reason");
      });
    }
    const auto deadline = Clock::now() + kOpTimeout;
    Caught c = catchError([&] { p.comm.barrier(p.op("barrier", kOpTimeout)); });
    if (watchdog.joinable()) {
      watchdog.join();
    }
    done.fetch_add(1);
    expectError(c, "watchdog abort", p.rank(), {"watchdog-reason"});
    if (c.at >= deadline) {
      failCheck("rank ", p.rank(), " saw the abort only at its deadline: ", c.message);
    }
  }));
  CHECK(leaks.report() == "");
}

TEST_CASE("a peer whose heartbeat stops is declared dead before the deadline", "[shm][faults][dead]") {
  const int size = GENERATE(2, 3);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  ShmOptions o = smallOptions();
  o.heartbeatPeriod = Ms(10);
  o.deadAfter = Ms(100);
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    auto peer = std::make_unique<Peer>(rendezvous, r, size, o);
    peer->comm.barrier(peer->op("barrier"));
    if (r == 1) {
      std::this_thread::sleep_for(Ms(50));  // usually the others are asleep in the next barrier by now
      peer.reset();  // stops its heartbeat thread; threads cannot be killed, so this stands in for a dead process
      return;
    }
    const auto deadline = Clock::now() + Ms(30000);
    Caught c = catchError([&] { peer->comm.barrier(peer->op("barrier", Ms(30000))); });
    expectError(c, "dead peer", r, {"rank 1", "dead"});
    // With 3 ranks one survivor may learn of the death through the other's abort: the same type either way.
    if (!c.dead) {
      failCheck("rank ", r, " threw ", c.timeout ? "TimeoutError" : "a plain Error",
                ", expected PeerDeadError: ", c.message);
    }
    if (c.at >= deadline) {
      failCheck("rank ", r, " found rank 1 dead only at its deadline: ", c.message);
    }
    expectStaysFailed(*peer, "dead peer", "dead", c);
  }));
  CHECK(leaks.report() == "");
}

TEST_CASE("a new group works in the same threads after one failed", "[shm][faults]") {
  ShmLeakCheck leaks;
  auto errors = runGroupCollect(2, smallOptions(), [&](Peer& p) {
    p.comm.barrier(p.op("barrier", Ms(3000)));
    Caught c = catchError([&] {
      p.comm.broadcast(p.op("broadcast", Ms(3000)), nullptr, 0, p.rank());  // roots disagree
    });
    expectError(c, "mismatch", p.rank(), {"disagree"});
  });
  rethrowFailures(errors);
  runGroup(2, smallOptions(), [&](Peer& p) {
    std::vector<uint8_t> buf = p.rank() == 0 ? patternBytes(0, 100) : std::vector<uint8_t>(100);
    p.comm.broadcast(p.op("broadcast"), buf.data(), buf.size(), 0);
    checkPattern("broadcast after a failed group", p.rank(), buf.data(), buf.size(), 0);
  });
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
