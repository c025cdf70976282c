// TunedBackend's device dispatch without a GPU: a call that mixes CPU and CUDA tensors is refused by name (and
// fails the CPU group, as other caller errors do); CUDA tensors in a build without NCCL get a clear error, and in an
// NCCL build without a GPU torch's refusal reaches the caller the same way; CPU calls never create the NCCL side.
// The CUDA tensors here claim cuda:0 but have no memory behind them (this machine may have no GPU): enough for the
// dispatch, which looks only at devices, never at data.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>
#include <vector>

#include "backend/tuned_backend.h"
#include "stand_in_backend.h"

namespace {

using tunedist_test::errorOf;

using tunedist_test::deviceOnlyCudaTensor;

c10::intrusive_ptr<tunedist::TunedBackend> makeBackend() {
  auto backend = tunedist::TunedBackend::create(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                std::chrono::milliseconds(20000));
  return c10::static_intrusive_pointer_cast<tunedist::TunedBackend>(backend);
}

}  // namespace

TEST_CASE("a CUDA tensor has the device the dispatch looks at") {
  auto t = deviceOnlyCudaTensor(4);
  REQUIRE(t.is_cuda());
  tunedist::cuda::DeviceScan scan;
  scan.add(std::vector<at::Tensor>{t, at::ones({4})});
  REQUIRE(scan.cuda);
  REQUIRE(scan.cpu);
}

TEST_CASE("a call mixing CPU and CUDA tensors is refused and fails the CPU group") {
  auto backend = makeBackend();
  std::vector<at::Tensor> in{at::ones({4})};
  std::vector<std::vector<at::Tensor>> out{{deviceOnlyCudaTensor(4)}};
  const std::string message = errorOf([&] { backend->allgather(out, in)->wait(); });
  CHECK_THAT(message, Catch::Contains("all_gather") && Catch::Contains("rank 0 of 1") &&
                          Catch::Contains("mixes CPU and CUDA tensors"));
  CHECK(backend->ncclBackend() == nullptr);  // refused before the NCCL side was created
  // Like any caller error of a collective, it failed the group so that peers do not wait for this rank.
  std::vector<at::Tensor> cpu{at::ones({4})};
  CHECK_THAT(errorOf([&] { backend->allreduce(cpu)->wait(); }), Catch::Contains("mixes CPU and CUDA tensors"));
}

TEST_CASE("CPU calls never create the NCCL side") {
  auto backend = makeBackend();
  std::vector<at::Tensor> t{at::ones({16})};
  backend->allreduce(t)->wait();
  backend->barrier()->wait();
  CHECK(t[0].equal(at::ones({16})));
  CHECK(backend->ncclBackend() == nullptr);
}

TEST_CASE("after abort, CUDA calls fail like CPU calls, without creating the NCCL side") {
  auto backend = makeBackend();
  backend->abort();
  std::vector<at::Tensor> t{deviceOnlyCudaTensor(4)};
  CHECK_THAT(errorOf([&] { backend->allreduce(t); }),
             Catch::Contains("all_reduce") && Catch::Contains("shut down or aborted"));
  CHECK(backend->ncclBackend() == nullptr);
}

TEST_CASE("CUDA tensors without NCCL in the build, or without a GPU, give a clear error") {
  const bool ncclBuild = tunedist::cuda::ncclBuildInfo().compiledIn;
  if (ncclBuild && at::hasCUDA()) {
    SUCCEED("NCCL build on a GPU machine: tests/python/test_cuda_nccl.py covers the CUDA path");
    return;
  }
  auto backend = makeBackend();
  std::vector<at::Tensor> t{deviceOnlyCudaTensor(4)};
  const std::string message = errorOf([&] { backend->allreduce(t); });
  CHECK_THAT(message, Catch::Contains("all_reduce") && Catch::Contains("rank 0 of 1"));
  if (ncclBuild) {
    // torch's ProcessGroupNCCL refuses to be created without a GPU; the error reaches the caller, with op and rank.
    CHECK_THAT(message, Catch::Contains("GPU"));
  } else {
    CHECK_THAT(message, Catch::Contains("no NCCL support") && Catch::Contains("cpu:tuned,cuda:nccl"));
  }
  // p2p caller errors do not fail the group: a CPU collective still works afterwards.
  auto other = makeBackend();
  CHECK_THAT(errorOf([&] { other->send(t, 0, 0); }), Catch::Contains("send") && Catch::Contains("rank 0 of 1"));
  std::vector<at::Tensor> cpu{at::ones({4})};
  CHECK_NOTHROW(other->allreduce(cpu)->wait());
}
