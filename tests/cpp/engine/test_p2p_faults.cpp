// P2pEngine failures: size mismatches (on the receiver, and reported to the sender), timeouts, peers that closed,
// died (a forked process that exits or is stopped) or aborted, and the destructor. Each failure must name the
// operation, the ranks, the tag and the sizes, and must leave nothing in /dev/shm.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "file_rendezvous.h"
#include "p2p_test_util.h"

namespace tunedist::test {
TEST_CASE("p2p size mismatch fails the receive and the sender's next send", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  Barrier barrier(2);
  runP2p(2, p2pOptions(), [&](P2pEngine& e, int r) {
    char small[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char big[16] = {};
    if (r == 0) {
      expectOk(sendWait(e, 1, 3, small, 8), "first send");
      barrier.wait();  // rank 1 has seen the mismatch
      expectError<core::Error>(sendWait(e, 1, 4, small, 8), "send after the mismatch",
                               {"send to rank 1 (tag 4", "rank 1 rejected", "sent 8 bytes", "expects 16 bytes",
                                "tag 3"});
      expectOk(sendWait(e, 1, 5, small, 8), "the send after that");
    } else {
      expectError<core::Error>(recvWait(e, 0, 3, big, 16), "mismatched recv",
                               {"recv on rank 1 from rank 0", "tag 3", "sent 8 bytes", "expects 16 bytes"});
      barrier.wait();
      expectOk(recvWait(e, 0, 5, big, 8), "recv after the mismatch");
      if (big[7] != 8) {
        failCheck("the message after a mismatch is wrong");
      }
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p size mismatch against a buffered (unexpected) message", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  runP2p(2, p2pOptions(), [&](P2pEngine& e, int r) {
    std::vector<uint8_t> a = patternBytes(0, 5000, 1), b = patternBytes(0, 4, 2);
    if (r == 0) {
      expectOk(sendWait(e, 1, 1, a.data(), a.size()), "send tag 1");
      expectOk(sendWait(e, 1, 9, b.data(), b.size()), "send tag 9");
      return;
    }
    std::vector<uint8_t> in(6000);
    // Receiving tag 9 first buffers the tag-1 message on the heap.
    expectOk(recvWait(e, 0, 9, in.data(), 4), "recv tag 9");
    expectError<core::Error>(recvWait(e, -1, 1, in.data(), 6000), "any-source recv of the wrong size",
                             {"any-source", "tag 1", "sent 5000 bytes", "expects 6000 bytes"});
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p timeouts name the operation, the peer, the tag and the size", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  Barrier barrier(3);
  runP2p(3, p2pOptions(4096), [&](P2pEngine& e, int r) {
    // Phase 1: rank 1 receives nothing yet, so a message larger than the ring cannot get through.
    if (r == 0) {
      std::vector<uint8_t> big(100000);
      expectError<core::TimeoutError>(sendWait(e, 1, 2, big.data(), big.size(), Ms(300)), "send to a deaf peer",
                                      {"send to rank 1 (tag 2, 100000 bytes) on rank 0: Timed out",
                                       "not started receiving"});
      expectError<core::Error>(sendWait(e, 1, 3, big.data(), 8), "send after a timed-out send", {"timeout"});
    }
    barrier.wait();
    // Phase 2: rank 2 never sends. The any-source receive also drains (and drops) the broken half message of
    // rank 0, whose channel is closed now.
    if (r == 1) {
      char buf[8];
      expectError<core::TimeoutError>(recvWait(e, 2, 4, buf, 8, Ms(200)), "recv from a silent peer",
                                      {"recv from rank 2 (tag 4, 8 bytes) on rank 1: Timed out", "has sent nothing"});
      expectError<core::TimeoutError>(recvWait(e, -1, 4, buf, 8, Ms(200)), "any-source recv",
                                      {"recv from any source (tag 4", "Timed out"});
      expectError<core::PeerDeadError>(recvWait(e, 0, 2, buf, 8, Ms(200)), "recv from the broken channel",
                                       {"recv from rank 0", "rank 0 closed"});
    }
    barrier.wait();
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p a peer that closed its engine fails the operations waiting on it", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  auto rendezvous = std::make_shared<MemRendezvous>();
  Barrier attached(2);
  std::vector<uint8_t> big(1 << 20);
  Outcome sendOutcome, recvOutcome;
  std::exception_ptr rank1Error;
  std::thread rank1([&] {
    try {
      P2pEngine e(rendezvous, 1, 2, p2pOptions());
      char c = 7;
      expectOk(sendWait(e, 0, 0, &c, 1), "rank 1's send");
      char d = 0;
      expectOk(recvWait(e, 0, 0, &d, 1), "rank 1's recv");  // attaches rank 0's ring
    } catch (...) {
      rank1Error = std::current_exception();
    }
    attached.wait();
  });
  {
    P2pEngine e(rendezvous, 0, 2, p2pOptions());
    char c = 0, d = 1;
    expectOk(recvWait(e, 1, 0, &c, 1), "rank 0's recv");
    expectOk(sendWait(e, 1, 0, &d, 1), "rank 0's send");
    attached.wait();
    rank1.join();  // rank 1's engine is gone
    REQUIRE(rank1Error == nullptr);
    sendOutcome = sendWait(e, 1, 1, big.data(), big.size());
    recvOutcome = recvWait(e, 1, 1, &c, 1);
  }
  expectError<core::PeerDeadError>(sendOutcome, "send to a closed peer", {"send to rank 1", "rank 1 closed"});
  expectError<core::PeerDeadError>(recvOutcome, "recv from a closed peer", {"recv from rank 1", "rank 1 closed"});
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p abort fails pending and later operations; the peer sees the channel closed", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  Barrier barrier(2);
  runP2p(2, p2pOptions(4096), [&](P2pEngine& e, int r) {
    std::vector<uint8_t> buf(50000);
    if (r == 0) {
      Waiter sent, got;
      e.isend(1, 1, buf.data(), buf.size(), Clock::now() + kOpTimeout, sent.done());
      e.irecv(1, 1, buf.data(), 8, Clock::now() + kOpTimeout, got.done());
      std::this_thread::sleep_for(Ms(50));  // the send is stuck: the ring is full and rank 1 does not read yet
      e.abort("tunedist: test abort reason");
      expectError<core::Error>(sent.get(), "pending send after abort", {"send to rank 1", "test abort reason"});
      expectError<core::Error>(got.get(), "pending recv after abort", {"recv from rank 1", "test abort reason"});
      expectError<core::Error>(sendWait(e, 1, 2, buf.data(), 8), "send after abort", {"test abort reason"});
      barrier.wait();
    } else {
      barrier.wait();
      // The first 4 KiB of the message are there, the rest never comes.
      expectError<core::PeerDeadError>(recvWait(e, 0, 1, buf.data(), buf.size()), "recv from an aborted peer",
                                       {"recv from rank 0", "rank 0 closed"});
    }
    barrier.wait();  // rank 0's engine (and its ring's name) stays until rank 1 has looked
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p destroying the engine fails what is pending, even from a Done callback", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  auto rendezvous = std::make_shared<MemRendezvous>();
  char buf[4];
  Waiter w;
  {
    P2pEngine e(rendezvous, 0, 2, p2pOptions());
    e.irecv(1, 0, buf, 4, Clock::now() + kOpTimeout, w.done());
  }
  expectError<core::Error>(w.get(), "recv pending at destruction", {"recv from rank 1", "destroyed"});

  // The last owner drops the engine inside a Done callback, on the engine's own thread.
  auto holder = std::make_shared<std::unique_ptr<P2pEngine>>(std::make_unique<P2pEngine>(rendezvous, 0, 2,
                                                                                         p2pOptions()));
  std::promise<void> dropped;
  (*holder)->irecv(1, 0, buf, 4, Clock::now() + Ms(50), [holder, &dropped](std::exception_ptr, int) {
    holder->reset();
    dropped.set_value();
  });
  REQUIRE(dropped.get_future().wait_for(kOpTimeout) == std::future_status::ready);
  // The detached thread frees the engine shortly after the callback returns.
  for (int i = 0; i < 100 && !leaks.report().empty(); ++i) {
    std::this_thread::sleep_for(Ms(20));
  }
  CHECK(leaks.report().empty());
}

#ifndef TUNEDIST_TEST_UNDER_TSAN
// A peer in another process that exits without closing anything is dead: messages it sent before are delivered,
// the next receive fails with PeerDeadError. One that is stopped (SIGSTOP: a debugger, py-spy, the cgroup freezer)
// is alive though its heartbeat no longer moves: a receive from it waits, and times out naming it, until it is
// killed; then the next receive finds it dead.
TEST_CASE("p2p a peer process that exits is dead, one that is stopped is not", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  const bool stop = GENERATE(false, true);
  INFO((stop ? "stopped peer" : "exited peer"));
  auto rendezvous = std::make_shared<FileRendezvous>();
  const ShmOptions options = p2pFastDeathOptions();
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 1;
    {
      P2pEngine e(rendezvous, 1, 2, options);
      char c = 42;
      Waiter w;
      e.isend(0, 0, &c, 1, Clock::now() + kOpTimeout, w.done());
      rc = w.get().error ? 1 : 0;
      if (stop) {
        for (;;) {
          pause();
        }
      }
      _exit(rc);  // no destructors: nothing is closed, the heartbeat just stops
    }
  }
  char c = 0;
  {
    P2pEngine e(rendezvous, 0, 2, options);
    REQUIRE_NOTHROW(expectOk(recvWait(e, 1, 0, &c, 1), "recv from the child"));
    CHECK(c == 42);
    if (stop) {
      kill(child, SIGSTOP);
      // Five times the heartbeat's deadAfter: stopped, not dead, so the receive runs into its own timeout.
      Outcome slow = recvWait(e, 1, 0, &c, 1, 5 * options.deadAfter);
      REQUIRE_NOTHROW(expectError<core::TimeoutError>(slow, "recv from a stopped peer", {"rank 1"}));
    }
    if (stop) {
      kill(child, SIGKILL);
    }
    Outcome o = recvWait(e, 1, 0, &c, 1);
    int status = 0;
    waitpid(child, &status, 0);
    if (!stop) {
      CHECK(WIFEXITED(status));
    }
    REQUIRE_NOTHROW(expectError<core::PeerDeadError>(o, stop ? "recv from a killed peer" : "recv from an exited peer",
                                                     {"rank 1", "exited"}));
  }
  CHECK(leaks.report().empty());
}

// A peer that dies before it has a ring with this rank: a receive from a sender that never sent, and a send too large
// for the ring to a receiver that never mapped it, both fail as dead (its identity, published when its engine was
// made), not at their timeout, naming the operation and both ranks.
TEST_CASE("p2p a peer process that exits before any message with this rank is dead", "[shm][p2p][faults]") {
  ShmLeakCheck leaks;
  const bool receiving = GENERATE(true, false);
  INFO((receiving ? "recv from it" : "send to it"));
  auto rendezvous = std::make_shared<FileRendezvous>();
  const ShmOptions options = p2pFastDeathOptions();
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    {
      P2pEngine e(rendezvous, 1, 2, options);
      _exit(0);  // no destructors, no message: only its published identity says who it was
    }
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  {
    P2pEngine e(rendezvous, 0, 2, options);
    std::vector<uint8_t> buf(4 * options.p2pChannelBytes);
    if (receiving) {
      REQUIRE_NOTHROW(expectError<core::PeerDeadError>(recvWait(e, 1, 0, buf.data(), buf.size()),
                                                       "recv from a peer that never sent",
                                                       {"recv from rank 1", "on rank 0", "is dead",
                                                        "exited before it sent anything to this rank"}));
    } else {
      REQUIRE_NOTHROW(expectError<core::PeerDeadError>(sendWait(e, 1, 0, buf.data(), buf.size()),
                                                       "send to a peer that never received",
                                                       {"send to rank 1", "rank 0", "is dead",
                                                        "exited before it received anything"}));
    }
  }
  CHECK(leaks.report().empty());
}
#endif

}  // namespace tunedist::test
