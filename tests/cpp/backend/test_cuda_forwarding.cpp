// What a plain `tuned` group forwards to its NCCL side, without a GPU: a stand-in c10d::Backend (stand_in_backend.h)
// takes the place of the backend torch makes for "nccl" (the NCCL side's factory, which Python fills with torch's
// creator, hands it over) and records every call. What is checked: CPU-only use never makes the NCCL side; CUDA calls,
// coalescing, hooks, timeouts, the error state, windows, shrink, the memory and time-estimation calls reach it; what
// was asked of the group before it existed is handed to it when it is made; refusals name op and rank.
#include "catch_torch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

#include "backend/tuned_backend.h"
#include "stand_in_backend.h"

namespace {

using tunedist_test::errorOf;

using tunedist::TunedBackend;
using tunedist::cuda::NcclSide;
using tunedist_test::deviceOnlyCudaTensor;
using tunedist_test::StandIn;

// A group of `size` ranks (this is rank 0) whose NCCL side is made by a factory that records what it was given.
struct Group {
  std::vector<NcclSide::CreateArgs> made;
  c10::intrusive_ptr<StandIn> standIn;
  c10::intrusive_ptr<TunedBackend> backend;

  explicit Group(bool capable, int size = 1) {
    TunedBackend::Options options;
    options.cpu.timeout = std::chrono::milliseconds(20000);
    options.ncclFactory = [this, capable](const NcclSide::CreateArgs& args) -> c10::intrusive_ptr<c10d::Backend> {
      made.push_back(args);
      standIn = c10::make_intrusive<StandIn>(args.rank, args.size, capable);
      return standIn;
    };
    backend = c10::make_intrusive<TunedBackend>(c10::make_intrusive<c10d::HashStore>(), 0, size, std::move(options));
  }
};

}  // namespace

TEST_CASE("a CPU-only group never makes its NCCL side and answers for its CPU side") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  std::vector<at::Tensor> t{at::ones({8})};
  b.allreduce(t)->wait();
  b.barrier()->wait();
  b.setTimeout(std::chrono::milliseconds(5000));
  b.addEphemeralTimeout(std::chrono::milliseconds(10));
  b.enableCollectivesTiming();
  b.registerAbortHook(1, [] {});
  CHECK(b.supportsCompletionHooks());  // the CPU side reports completions
  b.registerCompletionHook(2, [](const c10d::CompletionHookArgs&) {});
  b.unregisterCompletionHook(2);
  CHECK(b.supportsTensorAlloc(-1));
  CHECK_FALSE(b.supportsTimeEstimation());
  CHECK(b.supportsWindow() == b.cpu().supportsWindow());  // an unbound group answers for its CPU side
  CHECK(b.getError() == c10d::ErrorType::SUCCESS);
  CHECK(g.made.empty());
  CHECK(b.ncclBackend() == nullptr);
  // The calls only a CUDA backend can serve, on a group without one, are refused by op and rank.
  CHECK_THAT(errorOf([&] { b.suspend(); }),
             Catch::Contains("suspend") && Catch::Contains("rank 0 of 1") && Catch::Contains("no CUDA side"));
  CHECK_THAT(errorOf([&] { b.getMemoryStats(); }), Catch::Contains("get_memory_stats"));
  CHECK_THAT(errorOf([&] { b.startTimeEstimate(); }), Catch::Contains("start_time_estimate"));
  CHECK(g.made.empty());
}

TEST_CASE("CUDA calls reach the backend the factory made, once made, with the group's name, timeout and device") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  b.setGroupUid("grp-7");
  b.setGroupDesc("the world");
  b.setTimeout(std::chrono::milliseconds(4321));
  auto x = deviceOnlyCudaTensor(4);
  auto y = deviceOnlyCudaTensor(4);
  std::vector<at::Tensor> xs{x};
  b.allreduce(xs)->wait();
  b._allgather_base(y, x)->wait();
#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
  b.gather_single(y, x)->wait();
#endif
  std::vector<int64_t> none;
  b.alltoall_base(y, x, none, none)->wait();
  b.send(xs, 0, 3)->wait();
  b.recv(xs, 0, 3)->wait();
  c10d::BarrierOptions cudaBarrier;
  cudaBarrier.device = at::Device(at::kCUDA, 0);
  b.barrier(cudaBarrier)->wait();
  // Coalescing: the block's first CUDA call starts the NCCL side's block, and its Work is the block's.
  b.startCoalescing();
  b.allreduce(xs);
  b.allreduce(xs);
  b.endCoalescing()->wait();

  REQUIRE(g.made.size() == 1);
  const auto& args = g.made[0];
  CHECK(args.rank == 0);
  CHECK(args.size == 1);
  CHECK(args.groupUid == "grp-7");
  CHECK(args.timeout == std::chrono::milliseconds(4321));
  CHECK_FALSE(args.device.has_value());  // not bound: the creator picks the device as it does for "nccl"
  CHECK(g.standIn->getGroupDesc() == "the world");
  std::vector<std::string> expected{"allreduce", "_allgather_base"};
#ifdef TUNEDIST_C10D_HAS_GATHER_SINGLE
  expected.push_back("gather_single");
#endif
  for (const char* name :
       {"alltoall_base", "send", "recv", "barrier", "startCoalescing", "allreduce", "allreduce", "endCoalescing"}) {
    expected.push_back(name);
  }
  CHECK(g.standIn->calls() == expected);
  CHECK(b.ncclBackend().get() == g.standIn.get());
  // What spans the group reaches both sides now.
  b.setTimeout(std::chrono::milliseconds(999));
  CHECK(g.standIn->timeout == std::chrono::milliseconds(999));
  b.addEphemeralTimeout(std::chrono::milliseconds(30));
  CHECK(g.standIn->ephemeral == std::chrono::milliseconds(30));
  g.standIn->error = c10d::ErrorType::COMM_ERROR;
  CHECK(b.getError() == c10d::ErrorType::COMM_ERROR);
}

TEST_CASE("hooks and timing asked for before the NCCL side exists are handed to it when it is made") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  int aborts = 0;
  b.registerAbortHook(1, [&aborts] { ++aborts; });
  b.registerAbortHook(2, [] {});
  b.unregisterAbortHook(2);
  b.registerCompletionHook(5, [](const c10d::CompletionHookArgs&) {});
  b.registerCompletionHook(6, [](const c10d::CompletionHookArgs&) {});
  b.unregisterCompletionHook(6);
  b.registerOnCompletionHook([](std::shared_ptr<c10d::WorkInfo>) {});
  CHECK(b.hasHooks());  // destroy_process_group then waits for the hooks (waitForPendingWorks)
  b.enableCollectivesTiming();
  std::vector<at::Tensor> xs{deviceOnlyCudaTensor(4)};
  b.allreduce(xs)->wait();
  REQUIRE(g.standIn);
  CHECK(g.standIn->abortHooks.size() == 1);
  CHECK(g.standIn->abortHooks.count(1) == 1);
  CHECK(g.standIn->completionHooks.size() == 1);
  CHECK(g.standIn->completionHooks.count(5) == 1);
  CHECK(g.standIn->hasHooks());
  CHECK(g.standIn->called("enableCollectivesTiming"));
  b.waitForPendingWorks();
  CHECK(g.standIn->called("waitForPendingWorks"));
  // After creation, registration goes straight through.
  b.registerCompletionHook(8, [](const c10d::CompletionHookArgs&) {});
  CHECK(g.standIn->completionHooks.count(8) == 1);
  // The NCCL side's own abort (its watchdog's, here the group's) runs the forwarded hook too.
  b.abort();
  CHECK(g.standIn->called("abort"));
  CHECK(aborts == 2);  // once by the group, once by the NCCL side: torch asks abort hooks to be idempotent
}

TEST_CASE("an NCCL side without completion hooks: the group says so and refuses keyed hooks by name") {
  Group g(/*capable=*/false);
  auto& b = *g.backend;
  CHECK(b.supportsCompletionHooks());                                   // before the NCCL side: the CPU side's answer
  b.registerCompletionHook(1, [](const c10d::CompletionHookArgs&) {});  // taken; the NCCL side warns at creation
  std::vector<at::Tensor> xs{deviceOnlyCudaTensor(4)};
  b.allreduce(xs)->wait();
  CHECK(g.standIn->completionHooks.empty());
  CHECK_FALSE(b.supportsCompletionHooks());
  CHECK_THAT(errorOf([&] { b.registerCompletionHook(2, [](const c10d::CompletionHookArgs&) {}); }),
             Catch::Contains("registerCompletionHook") && Catch::Contains("rank 0") && Catch::Contains("stand-in"));
  // The on-completion hook still reports the CPU side's operations (a warning names the NCCL side's refusal).
  b.registerOnCompletionHook([](std::shared_ptr<c10d::WorkInfo>) {});
  CHECK_FALSE(g.standIn->called("registerOnCompletionHook"));
  CHECK_FALSE(b.supportsTimeEstimation());
  CHECK_FALSE(b.supportsTensorAlloc(0));
}

TEST_CASE("a group bound to a CUDA device makes its NCCL side at once and sends device-less calls there") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  const at::Device cuda0(at::kCUDA, 0);
  b.setBoundDeviceId(cuda0);
  CHECK(g.made.empty());
  b.eagerConnectSingleDevice(cuda0);  // what torch does after binding a group whose backend can split
  REQUIRE(g.made.size() == 1);
  REQUIRE(g.made[0].device.has_value());
  CHECK(*g.made[0].device == cuda0);
  CHECK(g.standIn->called("eagerConnectSingleDevice"));
  CHECK(b.supportsWindow());
  b.new_window();
  CHECK(g.standIn->called("new_window"));
  // A window of a CPU tensor is the CPU side's, whatever the group is bound to.
  errorOf([&] { b.new_window(at::ones({4})); });
  CHECK(g.standIn->calls().size() == 2);
  CHECK(b.supportsTimeEstimation());
  b.startTimeEstimate();
  CHECK(b.endTimeEstimate() == 42.0f);
  b.getMemAllocator();
  b.suspend();
  b.resume();
  CHECK(b.getMemoryStats().at("bytes") == 7);
  CHECK(b.supportsTensorAlloc(0));
  CHECK(b.allocateTensor(16, at::TensorOptions().device(cuda0)).numel() == 16);
  for (const char* name :
       {"startTimeEstimate", "endTimeEstimate", "getMemAllocator", "suspend", "resume", "allocateTensor"}) {
    CHECK(g.standIn->called(name));
  }
  // A CPU device never touches the NCCL side.
  b.eagerConnectSingleDevice(at::Device(at::kCPU));
  CHECK(g.made.size() == 1);
}

TEST_CASE("a CUDA-only question on an unbound group makes the NCCL side (FSDP2 asks before its first collective)") {
  Group g(/*capable=*/true);
  CHECK(g.backend->supportsTensorAlloc(0));
  CHECK(g.made.size() == 1);
  g.backend->getMemAllocator();
  CHECK(g.made.size() == 1);
}

TEST_CASE("shrink: an NCCL side that can shrink itself is the new group's; one that cannot is made afresh") {
  for (bool capable : {true, false}) {
    Group g(capable, /*size=*/2);
    g.backend->eagerConnectSingleDevice(at::Device(at::kCUDA, 0));
    REQUIRE(g.standIn);
    auto parentSide = g.standIn;
    auto child = c10::static_intrusive_pointer_cast<TunedBackend>(g.backend->shrink({1}));
    REQUIRE(child);
    CHECK(child->getSize() == 1);
    CHECK(parentSide->called("shrink") == capable);
    if (capable) {
      REQUIRE(child->ncclBackend());
      CHECK(child->ncclBackend()->getSize() == 1);
      CHECK(g.made.size() == 1);
    } else {
      CHECK(child->ncclBackend() == nullptr);
      std::vector<at::Tensor> xs{deviceOnlyCudaTensor(4)};
      child->allreduce(xs)->wait();  // the factory makes the new group's side at its first CUDA call
      REQUIRE(g.made.size() == 2);
      CHECK(g.made[1].size == 1);
      CHECK(g.made[1].store.get() != g.made[0].store.get());
    }
    child->shutdown();
  }
}

#ifdef C10D_BACKEND_HAS_RECONFIGURE
TEST_CASE("reconfigure re-forms both sides once the NCCL side exists, from one handle per member") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  CHECK(b.supportsReconfigure());  // no NCCL side yet: the CPU side's answer
  const std::string cpuOnly = b.get_reconfigure_handle();
  CHECK(cpuOnly.rfind("tuned:", 0) == 0);
  b.eagerConnectSingleDevice(at::Device(at::kCUDA, 0));
  REQUIRE(g.standIn);
  CHECK(b.supportsReconfigure());
  const std::string both = b.get_reconfigure_handle();
  CHECK(both.rfind("tuned2:", 0) == 0);
  CHECK(both.size() > 17);
  CHECK(both.compare(both.size() - 10, 10, "stand-in:0") == 0);  // the NCCL side's handle closes it

  // A handle of a member whose group has no NCCL side is refused before anything changes.
  c10d::ReconfigureOptions plain;
  plain.uuid = 11;
  plain.handles = std::vector<c10d::ReconfigureHandle>{cpuOnly};
  CHECK_THAT(errorOf([&] { b.reconfigure(plain); }),
             Catch::Contains("reconfigure on rank 0") && Catch::Contains("has no CUDA part"));
  CHECK_FALSE(g.standIn->called("reconfigure"));

  // As a set of one: the CPU side is re-formed from the CPU part, the NCCL side from its part, as a list.
  c10d::ReconfigureOptions opts;
  opts.uuid = 12;
  opts.handles = std::unordered_set<c10d::ReconfigureHandle>{both};
  opts.timeout = std::chrono::milliseconds(20000);
  auto work = b.reconfigure(opts);
  REQUIRE(work->wait(std::chrono::milliseconds(20000)));
  CHECK(work->isCompleted());
  CHECK(g.standIn->called("reconfigure"));
  CHECK(g.standIn->reconfiguredWith == std::vector<c10d::ReconfigureHandle>{"stand-in:0"});
  CHECK(b.getRank() == 0);
  CHECK(b.getSize() == 1);
  // The group works on its new CPU side, and its handle now carries the new membership's uuid.
  std::vector<at::Tensor> t{at::ones({8})};
  b.allreduce(t)->wait();
  CHECK(t[0].equal(at::ones({8})));
  CHECK(b.get_reconfigure_handle().find(":12:") != std::string::npos);
  CHECK(g.made.size() == 1);  // the NCCL side was reconfigured in place, not made again
}

TEST_CASE("a reconfigure without an NCCL side is the CPU side's, and its Work waits with a timeout") {
  Group g(/*capable=*/true);
  auto& b = *g.backend;
  c10d::ReconfigureOptions opts;
  opts.uuid = 21;
  opts.handles = std::vector<c10d::ReconfigureHandle>{b.get_reconfigure_handle()};
  auto work = b.reconfigure(opts);
  CHECK(work->wait(std::chrono::milliseconds(1000)));  // torch's Work.wait(timeout) passes one
  CHECK(work->getFuture()->completed());
  CHECK(g.made.empty());  // a CPU-only group still has no NCCL side
  std::vector<at::Tensor> t{at::ones({4})};
  b.allreduce(t)->wait();
  CHECK(t[0].equal(at::ones({4})));
}

TEST_CASE("reconfigure is refused by name where the NCCL side cannot take new members") {
  Group g(/*capable=*/false);
  auto& b = *g.backend;
  b.eagerConnectSingleDevice(at::Device(at::kCUDA, 0));
  REQUIRE(g.standIn);
  CHECK_FALSE(b.supportsReconfigure());
  c10d::ReconfigureOptions opts;
  opts.uuid = 13;
  opts.handles = std::vector<c10d::ReconfigureHandle>{"tuned2:1:xstand-in:0"};
  CHECK_THAT(errorOf([&] { b.reconfigure(opts); }), Catch::Contains("reconfigure on rank 0") &&
                                                        Catch::Contains("stand-in") &&
                                                        Catch::Contains("supports_reconfigure=False"));
  CHECK_FALSE(g.standIn->called("reconfigure"));
}
#endif

TEST_CASE("after abort or shutdown the NCCL side is closed once and never made again") {
  for (bool made : {false, true}) {
    Group g(/*capable=*/true);
    std::vector<at::Tensor> xs{deviceOnlyCudaTensor(4)};
    if (made) {
      g.backend->allreduce(xs)->wait();
    }
    g.backend->shutdown();
    g.backend->shutdown();
    CHECK_THAT(errorOf([&] { g.backend->allreduce(xs); }),
               Catch::Contains("all_reduce") && Catch::Contains("shut down or aborted"));
    CHECK(g.made.size() == (made ? 1u : 0u));
    if (made) {
      auto calls = g.standIn->calls();
      CHECK(std::count(calls.begin(), calls.end(), "shutdown") == 1);
    }
  }
}

TEST_CASE("a factory's error reaches the caller with op and rank, and fails the CPU group like any caller error") {
  TunedBackend::Options options;
  options.ncclFactory = [](const NcclSide::CreateArgs&) -> c10::intrusive_ptr<c10d::Backend> {
    TORCH_CHECK(false, "nccl2 requires at least one CUDA device");
  };
  auto backend = c10::make_intrusive<TunedBackend>(c10::make_intrusive<c10d::HashStore>(), 0, 1, std::move(options));
  std::vector<at::Tensor> xs{deviceOnlyCudaTensor(4)};
  CHECK_THAT(errorOf([&] { backend->allreduce(xs); }), Catch::Contains("all_reduce") &&
                                                           Catch::Contains("rank 0 of 1") &&
                                                           Catch::Contains("requires at least one CUDA device"));
  CHECK_THAT(errorOf([&] { backend->getMemAllocator(); }),
             Catch::Contains("mem_allocator") && Catch::Contains("requires at least one CUDA device"));
  CHECK(backend->ncclBackend() == nullptr);
}
