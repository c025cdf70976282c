// P2pEngine: point-to-point messages between ranks running as threads, each with its own engine, over an in-memory
// rendezvous. Data is a pattern that depends on the sender and the message, so a message delivered to the wrong
// receive or at a wrong offset shows. Failures (size mismatch, timeouts, dead peers, abort) are in
// test_shm_p2p_faults.cpp. Every test ends by checking that it left nothing in /dev/shm.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <vector>

#include "p2p_test_util.h"

namespace tunedist::test {
namespace {

// Message `i` of a test sequence: sizes from 0 through a few ring lengths, odd ones included.
size_t sizeOf(int i) { return size_t(i) * 397 % 9001; }

}  // namespace

TEST_CASE("p2p ping-pong keeps every byte", "[shm][p2p]") {
  ShmLeakCheck leaks;
  const size_t ring = GENERATE(size_t(4096), ShmOptions::kDefaultP2pChannelBytes);
  INFO("ring bytes " << ring);
  runP2p(2, p2pOptions(ring), [](P2pEngine& e, int r) {
    const int peer = 1 - r;
    for (int i = 0; i < 60; ++i) {
      const size_t n = sizeOf(i);
      if ((i % 2) == r) {
        auto out = patternBytes(r, n, i);
        expectOk(sendWait(e, peer, 0, out.data(), n), core::detail::str("send ", i));
      } else {
        std::vector<uint8_t> in(n + 1, 0xEE);
        int src = expectOk(recvWait(e, peer, 0, in.data(), n), core::detail::str("recv ", i));
        if (src != peer) {
          failCheck("recv ", i, " reported source ", src);
        }
        checkPattern(core::detail::str("ping-pong message ", i), r, in.data(), n, peer, i);
        if (in[n] != 0xEE) {
          failCheck("recv ", i, " wrote past the buffer");
        }
      }
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p many queued messages arrive in order", "[shm][p2p]") {
  ShmLeakCheck leaks;
  const int kCount = 300;
  runP2p(2, p2pOptions(), [&](P2pEngine& e, int r) {
    if (r == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<Waiter> waiters(kCount);
      for (int i = 0; i < kCount; ++i) {
        out.push_back(patternBytes(r, sizeOf(i), i));
      }
      for (int i = 0; i < kCount; ++i) {
        e.isend(1, 5, out[size_t(i)].data(), out[size_t(i)].size(), Clock::now() + kOpTimeout,
                waiters[size_t(i)].done());
      }
      for (int i = 0; i < kCount; ++i) {
        expectOk(waiters[size_t(i)].get(), core::detail::str("send ", i));
      }
    } else {
      std::vector<std::vector<uint8_t>> in;
      std::vector<Waiter> waiters(kCount);
      for (int i = 0; i < kCount; ++i) {
        in.emplace_back(sizeOf(i));
      }
      // Post every receive up front: they must match the messages in posting order.
      for (int i = 0; i < kCount; ++i) {
        e.irecv(0, 5, in[size_t(i)].data(), in[size_t(i)].size(), Clock::now() + kOpTimeout, waiters[size_t(i)].done());
      }
      for (int i = 0; i < kCount; ++i) {
        expectOk(waiters[size_t(i)].get(), core::detail::str("recv ", i));
        checkPattern(core::detail::str("message ", i), r, in[size_t(i)].data(), in[size_t(i)].size(), 0, i);
      }
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p messages much larger than the ring stream through it in both directions", "[shm][p2p]") {
  ShmLeakCheck leaks;
  const size_t n = GENERATE(size_t(4096 - 64), size_t(4096), size_t(1) << 20, (size_t(3) << 20) + 13);
  INFO("message bytes " << n);
  runP2p(2, p2pOptions(4096), [&](P2pEngine& e, int r) {
    auto out = patternBytes(r, n, 3);
    std::vector<uint8_t> in(n);
    Waiter sent, got;
    // Both sides send and receive at once: neither may wait for the other's send to finish.
    e.isend(1 - r, 9, out.data(), n, Clock::now() + kOpTimeout, sent.done());
    e.irecv(1 - r, 9, in.data(), n, Clock::now() + kOpTimeout, got.done());
    expectOk(sent.get(), "send");
    expectOk(got.get(), "recv");
    checkPattern("large message", r, in.data(), n, 1 - r, 3);
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p ring exchange among 3 ranks", "[shm][p2p]") {
  ShmLeakCheck leaks;
  const int size = 3;
  runP2p(size, p2pOptions(8192), [&](P2pEngine& e, int r) {
    for (int round = 0; round < 10; ++round) {
      const size_t n = sizeOf(round) * 7 + 1;
      auto out = patternBytes(r, n, round);
      std::vector<uint8_t> in(n);
      const int next = (r + 1) % size, prev = (r + size - 1) % size;
      Waiter sent, got;
      e.irecv(prev, round, in.data(), n, Clock::now() + kOpTimeout, got.done());
      e.isend(next, round, out.data(), n, Clock::now() + kOpTimeout, sent.done());
      expectOk(sent.get(), "send");
      expectOk(got.get(), "recv");
      checkPattern(core::detail::str("round ", round), r, in.data(), n, prev, round);
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p receives match tags, not arrival order", "[shm][p2p]") {
  ShmLeakCheck leaks;
  // Small messages fit the ring at once; large ones are still streaming when the receive for them is posted.
  const size_t n1 = GENERATE(size_t(100), size_t(20000));
  const size_t n2 = n1 * 2 + 5;
  INFO("sizes " << n1 << ", " << n2);
  runP2p(2, p2pOptions(4096), [&](P2pEngine& e, int r) {
    if (r == 0) {
      auto a = patternBytes(r, n1, 1), b = patternBytes(r, n2, 2);
      Waiter s1, s2;
      e.isend(1, 1, a.data(), n1, Clock::now() + kOpTimeout, s1.done());
      e.isend(1, 2, b.data(), n2, Clock::now() + kOpTimeout, s2.done());
      expectOk(s1.get(), "send tag 1");
      expectOk(s2.get(), "send tag 2");
    } else {
      std::vector<uint8_t> a(n1), b(n2);
      expectOk(recvWait(e, 0, 2, b.data(), n2), "recv tag 2");
      checkPattern("tag 2", r, b.data(), n2, 0, 2);
      expectOk(recvWait(e, 0, 1, a.data(), n1), "recv tag 1");
      checkPattern("tag 1", r, a.data(), n1, 0, 1);
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p any-source receives take messages of every sender, each sender in order", "[shm][p2p]") {
  ShmLeakCheck leaks;
  const int size = 4, perSender = 6;
  runP2p(size, p2pOptions(), [&](P2pEngine& e, int r) {
    // One size for all, so any message fits any receive; the pattern says which sender and which index.
    const size_t n = 777;
    if (r != 0) {
      for (int i = 0; i < perSender; ++i) {
        auto out = patternBytes(r, n, i);
        expectOk(sendWait(e, 0, 7, out.data(), n), core::detail::str("send ", i));
      }
      return;
    }
    std::map<int, int> nextFrom;  // per sender: the index its next message must carry
    for (int k = 0; k < (size - 1) * perSender; ++k) {
      std::vector<uint8_t> in(n);
      int src = expectOk(recvWait(e, -1, 7, in.data(), n), core::detail::str("any-source recv ", k));
      if (src < 1 || src >= size) {
        failCheck("any-source recv ", k, " reported source ", src);
      }
      checkPattern(core::detail::str("any-source message ", k), r, in.data(), n, src, nextFrom[src]++);
    }
    for (int src = 1; src < size; ++src) {
      if (nextFrom[src] != perSender) {
        failCheck("got ", nextFrom[src], " messages from rank ", src, ", expected ", perSender);
      }
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p zero-byte messages", "[shm][p2p]") {
  ShmLeakCheck leaks;
  runP2p(3, p2pOptions(), [&](P2pEngine& e, int r) {
    if (r != 0) {
      expectOk(sendWait(e, 0, 1, nullptr, 0), "send empty");
      auto out = patternBytes(r, 10, 0);
      expectOk(sendWait(e, 0, 2, out.data(), 10), "send 10 bytes");
      expectOk(sendWait(e, 0, 3, nullptr, 0), "send empty again");
      return;
    }
    for (int k = 0; k < 2; ++k) {
      int src = expectOk(recvWait(e, -1, 1, nullptr, 0), "any-source recv of an empty message");
      if (src < 1 || src > 2) {
        failCheck("any-source recv of an empty message reported source ", src);
      }
    }
    for (int src = 1; src <= 2; ++src) {
      std::vector<uint8_t> in(10);
      expectOk(recvWait(e, src, 3, nullptr, 0), "recv empty (tag 3) before tag 2");
      expectOk(recvWait(e, src, 2, in.data(), 10), "recv 10 bytes");
      checkPattern("after empty messages", r, in.data(), 10, src, 0);
    }
  });
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p a destroyed sender's sent messages are still delivered", "[shm][p2p]") {
  ShmLeakCheck leaks;
  auto rendezvous = std::make_shared<MemRendezvous>();
  auto out = patternBytes(0, 1000, 4);
  std::vector<uint8_t> in(1000);
  Outcome got;
  std::thread receiver([&] {
    P2pEngine e(rendezvous, 1, 2, p2pOptions());
    // Posted while the sender's engine is being destroyed: it lingers until we attach.
    std::this_thread::sleep_for(Ms(200));
    got = recvWait(e, 0, 0, in.data(), in.size());
  });
  {
    P2pEngine e(rendezvous, 0, 2, p2pOptions());
    expectOk(sendWait(e, 1, 0, out.data(), out.size()), "send");
  }
  receiver.join();
  REQUIRE_NOTHROW(expectOk(got, "recv after the sender was destroyed"));
  checkPattern("message of a destroyed sender", 1, in.data(), in.size(), 0, 4);
  CHECK(leaks.report().empty());
}

TEST_CASE("p2p rejects bad ranks and sending to oneself", "[shm][p2p]") {
  ShmLeakCheck leaks;
  auto rendezvous = std::make_shared<MemRendezvous>();
  P2pEngine e(rendezvous, 1, 3, p2pOptions());
  char b = 0;
  auto done = [](std::exception_ptr, int) {};
  CHECK_THROWS_WITH(e.isend(1, 0, &b, 1, Clock::now(), done), Catch::Contains("destination rank 1"));
  CHECK_THROWS_WITH(e.isend(3, 0, &b, 1, Clock::now(), done), Catch::Contains("destination rank 3"));
  CHECK_THROWS_WITH(e.irecv(1, 0, &b, 1, Clock::now(), done), Catch::Contains("source rank 1"));
  CHECK_THROWS_WITH(e.irecv(-2, 0, &b, 1, Clock::now(), done), Catch::Contains("source rank -2"));
  CHECK_THROWS_WITH(e.isend(0, 0, nullptr, 4, Clock::now(), done), Catch::Contains("null buffer"));
  CHECK(leaks.report().empty());
}

}  // namespace tunedist::test
