// Caller errors and edges at the op boundary: out-of-range roots, reductions without a meaning, slots too small
// for the group, and empty calls with null pointers (what torch passes for empty tensors).
#include <catch2/catch.hpp>

#include "shm_test_util.h"

namespace tunedist::test {

TEST_CASE("out-of-range roots are refused before anything is shared", "[shm][faults][validation]") {
  ShmLeakCheck leaks;
  // Rank 1 never comes: a refused call must fail at once, not wait for it.
  Peer p(std::make_shared<MemRendezvous>(), 0, 2, smallOptions());
  std::vector<uint8_t> buf(64);
  std::vector<void*> outs{buf.data(), buf.data()};
  std::vector<const void*> ins{buf.data(), buf.data()};
  for (int root : {-1, 2}) {
    INFO("root " << root);
    CHECK_THROWS_WITH(p.comm.broadcast(p.op("broadcast", Ms(1000)), buf.data(), 8, root), Catch::Contains("root"));
    CHECK_THROWS_WITH(p.comm.reduce(p.op("reduce", Ms(1000)), buf.data(), buf.data(), 2, floatSum(), root),
                      Catch::Contains("root"));
    CHECK_THROWS_WITH(p.comm.gather(p.op("gather", Ms(1000)), buf.data(), 8, outs.data(), root),
                      Catch::Contains("root"));
    CHECK_THROWS_WITH(p.comm.scatter(p.op("scatter", Ms(1000)), ins.data(), buf.data(), 8, root),
                      Catch::Contains("root"));
  }
  CHECK_FALSE(p.comm.failed());
  CHECK_FALSE(p.comm.attached());
  CHECK(leaks.report() == "");
}

TEST_CASE("slots too small for the group fail clearly on every rank instead of spinning", "[shm][faults][validation]") {
  // 4 KiB slots cut into 65 parts leave less than a 64-byte cache line per rank.
  const int size = 65;
  ShmLeakCheck leaks;
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    // What needs no per-rank part of a slot still works.
    p.comm.barrier(p.op("barrier"));
    std::vector<float> in(1024, 1.0f), out(1024);
    p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), 16, floatSum());  // one-shot
    if (out[0] != float(size)) {
      failAt("one-shot all_reduce with 65 ranks", p.rank(), 0, out[0], size);
    }
    // Two-shot all_reduce (4 KiB > the 1 KiB one-shot limit) cannot cut the slot into 65 slices.
    Caught c = catchError([&] { p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), 1024, floatSum()); });
    expectError(c, "two-shot all_reduce with 65 ranks", p.rank(), {"slot", "65 ranks"});
  }));
  rethrowFailures(runGroupCollect(size, smallOptions(), [&](Peer& p) {
    std::vector<uint8_t> send(size_t(size) * 8), recv(size_t(size) * 8);
    std::vector<const void*> sends;
    std::vector<void*> recvs;
    for (size_t q = 0; q < size_t(size); ++q) {
      sends.push_back(send.data() + 8 * q);
      recvs.push_back(recv.data() + 8 * q);
    }
    std::vector<size_t> bytes(size_t(size), 8);
    Caught c = catchError([&] {
      p.comm.alltoallv(p.op("all_to_all"), sends.data(), bytes.data(), recvs.data(), bytes.data());
    });
    expectError(c, "all_to_all with 65 ranks", p.rank(), {"slot", "65 ranks"});
  }));
  CHECK(leaks.report() == "");
}

TEST_CASE("reductions without a meaning are refused naming op and dtype", "[shm][validation]") {
  ShmLeakCheck leaks;
  Peer p(std::make_shared<MemRendezvous>(), 0, 2, smallOptions());
  std::vector<uint8_t> buf(64);
  std::vector<const void*> ins{buf.data(), buf.data()};
  struct Bad {
    DType dtype;
    RedOp op;
    const char* dtypeName;
  };
  for (const Bad& bad : {Bad{DType::kFloat32, RedOp::kBand, "float32"}, Bad{DType::kBFloat16, RedOp::kBxor, "bfloat16"},
                         Bad{DType::kBool, RedOp::kAvg, "bool"}, Bad{DType::kInt32, RedOp::kPremulSum, "int32"}}) {
    ReduceArgs args;
    args.dtype = bad.dtype;
    args.op = bad.op;
    args.divisor = 2;
    const std::string op = core::redOpName(bad.op);
    INFO(op << " on " << bad.dtypeName);
    const std::vector<Caught> refusals{
        catchError([&] { p.comm.allreduce(p.op("all_reduce", Ms(1000)), buf.data(), buf.data(), 4, args); }),
        catchError([&] { p.comm.reduce(p.op("reduce", Ms(1000)), buf.data(), buf.data(), 4, args, 0); }),
        catchError([&] { p.comm.reduceScatter(p.op("reduce_scatter", Ms(1000)), ins.data(), buf.data(), 4, args); })};
    for (const Caught& c : refusals) {
      CHECK(c.threw);
      CHECK_THAT(c.message, Catch::Contains(op) && Catch::Contains(bad.dtypeName));
    }
  }
  CHECK_FALSE(p.comm.failed());
  CHECK_FALSE(p.comm.attached());
  CHECK(leaks.report() == "");
}

TEST_CASE("empty calls with null pointers succeed", "[shm][validation]") {
  const int size = GENERATE(1, 2, 3);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runGroup(size, smallOptions(), [&](Peer& p) {
    const std::vector<void*> outs(size_t(size), nullptr);
    const std::vector<const void*> ins(size_t(size), nullptr);
    const std::vector<size_t> zeros(size_t(size), 0);
    p.comm.allreduce(p.op("all_reduce"), nullptr, nullptr, 0, floatSum());
    p.comm.reduce(p.op("reduce"), nullptr, nullptr, 0, floatSum(), size - 1);
    p.comm.reduceScatter(p.op("reduce_scatter"), ins.data(), nullptr, 0, floatSum());
    p.comm.broadcast(p.op("broadcast"), nullptr, 0, 0);
    p.comm.allgather(p.op("all_gather"), nullptr, 0, outs.data());
    p.comm.gather(p.op("gather"), nullptr, 0, outs.data(), size - 1);
    p.comm.scatter(p.op("scatter"), ins.data(), nullptr, 0, 0);
    p.comm.alltoallv(p.op("all_to_all"), ins.data(), zeros.data(), outs.data(), zeros.data());
    p.comm.barrier(p.op("barrier"));
  });
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
