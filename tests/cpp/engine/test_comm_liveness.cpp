// Liveness across processes: a peer process that is stopped (SIGSTOP: a debugger, py-spy, the cgroup freezer) is
// slow, not dead, and the collective completes once it continues; a peer process that is killed is found dead
// through its life lock (sync.h), not through a timing guess. Ranks are forked processes over a FileRendezvous.
#include <catch2/catch.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "file_rendezvous.h"
#include "shm_test_util.h"

namespace tunedist::test {
namespace {

constexpr size_t kCount = 1 << 16;  // 256 KiB of float32: above the default one-shot limit in small slots

// Heartbeats that stop being seen after 100 ms: before the life lock, a peer stopped for longer was "dead".
ShmOptions quickHeartbeat() {
  ShmOptions o = smallOptions();
  o.heartbeatPeriod = Ms(10);
  o.deadAfter = Ms(100);
  return o;
}

// Rank 1 in a child process: a barrier, then `rounds` all_reduces of rank-valued buffers; exits 0 when every result
// is right. Never returns.
[[noreturn]] void runChild(std::shared_ptr<FileRendezvous> rendezvous, const ShmOptions& o, int rounds) {
  int rc = 1;
  try {
    Peer p(rendezvous, 1, 2, o);
    p.comm.barrier(p.op("barrier", Ms(30000)));
    bool ok = true;
    for (int i = 0; i < rounds; ++i) {
      std::vector<float> buf(kCount, 2.0f);
      p.comm.allreduce(p.op("all_reduce", Ms(60000)), buf.data(), buf.data(), kCount, ReduceArgs{DType::kFloat32});
      ok = ok && buf[0] == 3.0f && buf[kCount - 1] == 3.0f;
    }
    rc = ok ? 0 : 2;
  } catch (...) {
    rc = 3;
  }
  _exit(rc);
}

}  // namespace

#ifndef TUNEDIST_TEST_UNDER_TSAN
TEST_CASE("a stopped peer process is slow, not dead: the collective completes after SIGCONT", "[shm][faults][stop]") {
  ShmLeakCheck leaks;
  const ShmOptions o = quickHeartbeat();
  auto rendezvous = std::make_shared<FileRendezvous>();
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    runChild(rendezvous, o, 3);
  }
  {
    Peer p(rendezvous, 0, 2, o);
    p.comm.barrier(p.op("barrier", Ms(30000)));
    // Stopped for 15 heartbeat deadlines while we wait for it inside the first all_reduce.
    REQUIRE(kill(child, SIGSTOP) == 0);
    std::thread resume([child] {
      std::this_thread::sleep_for(Ms(1500));
      kill(child, SIGCONT);
    });
    Caught c = catchError([&] {
      for (int i = 0; i < 3; ++i) {
        std::vector<float> buf(kCount, 1.0f);
        p.comm.allreduce(p.op("all_reduce", Ms(60000)), buf.data(), buf.data(), kCount, ReduceArgs{DType::kFloat32});
        if (buf[0] != 3.0f || buf[kCount - 1] != 3.0f) {
          failCheck("all_reduce ", i, " gave ", buf[0], ", expected 3");
        }
      }
    });
    resume.join();
    int status = 0;
    waitpid(child, &status, 0);
    CHECK_FALSE(c.threw);
    INFO(c.message);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(leaks.report().empty());
}

// The peer runs in its own pid namespace (as in a container sharing /dev/shm with --ipc=host), where its pid means
// nothing to us: neither kill() nor /proc can tell, and the heartbeat is set to take ten minutes. Only the life lock
// can say it died.
TEST_CASE("a peer process in another pid namespace is found dead through its life lock", "[shm][faults][dead]") {
  ShmLeakCheck leaks;
  ShmOptions o = smallOptions();
  o.deadAfter = Ms(600000);
  o.heartbeatPeriod = Ms(300000);
  auto rendezvous = std::make_shared<FileRendezvous>();
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (unshare(CLONE_NEWPID) != 0) {
      _exit(77);  // no permission for a pid namespace here
    }
    pid_t inner = fork();  // pid 1 of the new namespace
    if (inner == 0) {
      runChild(rendezvous, o, 0);  // a barrier, then exits without closing anything
    }
    int status = 0;
    waitpid(inner, &status, 0);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 4);
  }
  int status = 0;
  // Rank 1 joins the barrier below, so the parent learns whether the namespace could be made only by waiting.
  {
    Peer p(rendezvous, 0, 2, o);
    Caught b = catchError([&] { p.comm.barrier(p.op("barrier", Ms(10000))); });
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      WARN("unshare(CLONE_NEWPID) is not permitted here (needs root): the cross-namespace case was not run");
      return;
    }
    REQUIRE_FALSE(b.threw);
    Caught c = catchError([&] {
      std::vector<float> buf(kCount, 1.0f);
      p.comm.allreduce(p.op("all_reduce", Ms(60000)), buf.data(), buf.data(), kCount, ReduceArgs{DType::kFloat32});
    });
    INFO(c.message);
    CHECK(c.threw);
    CHECK(c.dead);
    CHECK(c.message.find("rank 1") != std::string::npos);
    CHECK(c.message.find("exited or left the group") != std::string::npos);
  }
  CHECK(leaks.report().empty());
}
#endif

}  // namespace tunedist::test
