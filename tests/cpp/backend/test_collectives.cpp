// The `tuned` c10d backend with ranks as threads of one process over a shared c10d::HashStore: every collective
// against closed-form values at world sizes 1-4, every dtype and reduce op of all_reduce, zero-element tensors,
// counts larger than one slot, and a caller error that fails every rank. The Python tests cover the same ground
// in real processes; these run in seconds and reach the backend without Python in between.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tunedist/tunedist.h>

#include "scoped_env.h"

namespace {

using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
constexpr std::chrono::milliseconds kTimeout{60000};

// Runs body(rank, backend) on `size` threads, each with its own backend over one HashStore, and reports every rank's
// failure (with the rank in front) from the test's thread after all threads ended. Catch2's assertion macros are
// not thread-safe, so the rank threads only throw (expect() below); nothing in them calls REQUIRE or INFO.
void runRanks(int size, const std::function<void(int, BackendPtr&)>& body) {
  static int groupCounter = 0;
  auto store = c10::make_intrusive<c10d::PrefixStore>("group" + std::to_string(++groupCounter),
                                                      c10::make_intrusive<c10d::HashStore>());
  std::atomic<int> finished{0};
  tunedist_test::runThreads(
      size,
      [&](int r) {
        BackendPtr backend = tunedist::createBackend(store, r, size, kTimeout);
        body(r, backend);
        finished.fetch_add(1);
      },
      "rank");
  CHECK(finished.load() == size);
}

// The value rank r contributes at element i: small integers, exact in every dtype (bf16 holds 8 bits of mantissa).
at::Tensor contribution(int r, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kLong).remainder(7) + r + 1).to(dtype);
}

// The closed-form result of reducing contribution(r) over r in [0, size) with `op`, computed in double (or in
// int64 for the bitwise ops).
at::Tensor expected(c10d::ReduceOp::RedOpType op, int size, int64_t n, at::ScalarType dtype) {
  at::Tensor acc = contribution(0, n, at::kLong);
  for (int r = 1; r < size; ++r) {
    at::Tensor x = contribution(r, n, at::kLong);
    switch (op) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::AVG: acc = acc + x; break;
      case c10d::ReduceOp::PRODUCT: acc = acc * x; break;
      case c10d::ReduceOp::MIN: acc = at::minimum(acc, x); break;
      case c10d::ReduceOp::MAX: acc = at::maximum(acc, x); break;
      case c10d::ReduceOp::BAND: acc = at::bitwise_and(acc, x); break;
      case c10d::ReduceOp::BOR: acc = at::bitwise_or(acc, x); break;
      case c10d::ReduceOp::BXOR: acc = at::bitwise_xor(acc, x); break;
      default: throw std::runtime_error("unexpected op");
    }
  }
  if (op == c10d::ReduceOp::AVG) {
    return (acc.to(at::kDouble) / size).to(dtype);
  }
  return acc.to(dtype);
}

void expect(bool cond, const std::string& what) {
  if (!cond) {
    throw std::runtime_error(what);
  }
}

void expectEqual(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.sizes() == want.sizes() && got.scalar_type() == want.scalar_type() && at::equal(got, want)) {
    return;
  }
  std::ostringstream os;
  os << what << "\ngot  " << got.slice(0, 0, std::min<int64_t>(8, got.numel())) << "\nwant "
     << want.slice(0, 0, std::min<int64_t>(8, want.numel()));
  throw std::runtime_error(os.str());
}

}  // namespace

TEST_CASE("backend all_reduce: every dtype and op against closed-form values", "[backend][allreduce]") {
  const int size = GENERATE(1, 2, 3, 4);
  // 0, 1, odd, and more than one 1 MiB slot of float32 (the pipelined path).
  const int64_t n = GENERATE(int64_t(0), int64_t(1), int64_t(1001), int64_t(300000));
  using Op = c10d::ReduceOp;
  struct Case {
    at::ScalarType dtype;
    std::vector<Op::RedOpType> ops;
  };
  const std::vector<Op::RedOpType> arith{Op::SUM, Op::AVG, Op::PRODUCT, Op::MIN, Op::MAX};
  const std::vector<Op::RedOpType> integer{Op::SUM, Op::PRODUCT, Op::MIN, Op::MAX, Op::BAND, Op::BOR, Op::BXOR};
  const std::vector<Case> cases{{at::kFloat, arith}, {at::kDouble, arith}, {at::kHalf, arith},   {at::kBFloat16, arith},
                                {at::kInt, integer}, {at::kLong, integer}, {at::kChar, integer}, {at::kByte, integer}};
  runRanks(size, [&](int rank, BackendPtr& backend) {
    for (const auto& c : cases) {
      for (auto op : c.ops) {
        // PRODUCT of up to 4 values of at most 10 overflows int8: keep it to the dtypes that hold it.
        if (op == Op::PRODUCT &&
            (c.dtype == at::kChar || c.dtype == at::kByte || c.dtype == at::kHalf || c.dtype == at::kBFloat16) &&
            size > 2) {
          continue;
        }
        std::vector<at::Tensor> t{contribution(rank, n, c.dtype)};
        c10d::AllreduceOptions opts;
        opts.reduceOp = c10d::ReduceOp(op);
        backend->allreduce(t, opts)->wait();
        expectEqual(t[0], expected(op, size, n, c.dtype),
                    std::string("all_reduce ") + c10::toString(c.dtype) + " op " + std::to_string(int(op)) + " n " +
                        std::to_string(n) + " world " + std::to_string(size));
      }
    }
  });
}

TEST_CASE("backend broadcast, all_gather, reduce_scatter, all_to_all, barrier", "[backend][collectives]") {
  const int size = GENERATE(1, 2, 3, 4);
  const int64_t n = GENERATE(int64_t(0), int64_t(5), int64_t(300000));
  runRanks(size, [&](int rank, BackendPtr& backend) {
    const auto rankValue = [n](int r) { return at::full({n}, double(r + 1), at::kFloat); };
    for (int root = 0; root < size; ++root) {
      std::vector<at::Tensor> t{rankValue(rank)};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      backend->broadcast(t, opts)->wait();
      expectEqual(t[0], rankValue(root), "broadcast from root " + std::to_string(root));
    }

    at::Tensor gathered = at::empty({n * size}, at::kFloat);
    at::Tensor mine = rankValue(rank);
    backend->_allgather_base(gathered, mine)->wait();
    for (int r = 0; r < size; ++r) {
      expectEqual(gathered.slice(0, r * n, (r + 1) * n), rankValue(r),
                  "all_gather_into_tensor block " + std::to_string(r));
    }

    // reduce_scatter_tensor: rank r's input block q holds q + r; rank q receives sum_r (q + r).
    at::Tensor input = at::empty({n * size}, at::kFloat);
    for (int q = 0; q < size; ++q) {
      input.slice(0, q * n, (q + 1) * n).fill_(double(q + rank));
    }
    at::Tensor out = at::empty({n}, at::kFloat);
    backend->_reduce_scatter_base(out, input)->wait();
    expectEqual(out, at::full({n}, double(size * rank + size * (size - 1) / 2), at::kFloat), "reduce_scatter");

    // all_to_all_single with even splits: rank r sends 100 * r + q to rank q.
    at::Tensor send = at::empty({n * size}, at::kFloat);
    for (int q = 0; q < size; ++q) {
      send.slice(0, q * n, (q + 1) * n).fill_(double(100 * rank + q));
    }
    at::Tensor recv = at::empty({n * size}, at::kFloat);
    std::vector<int64_t> noSplits;
    backend->alltoall_base(recv, send, noSplits, noSplits)->wait();
    for (int q = 0; q < size; ++q) {
      expectEqual(recv.slice(0, q * n, (q + 1) * n), at::full({n}, double(100 * q + rank), at::kFloat),
                  "all_to_all block from " + std::to_string(q));
    }
    backend->barrier()->wait();
  });
}

TEST_CASE("backend Work: op type, increasing sequence numbers, future holding the outputs", "[backend][work]") {
  runRanks(2, [&](int rank, BackendPtr& backend) {
    std::vector<at::Tensor> t{at::ones({16})};
    auto first = backend->allreduce(t);
    auto second = backend->allreduce(t);
    second->wait();
    first->wait();
    expect(first->retrieveOpType() == c10d::OpType::ALLREDUCE, "op type");
    expect(second->getSequencenumber() == first->getSequencenumber() + 1, "sequence numbers");
    auto value = second->getFuture()->value();
    expect(value.isTensorList(), "the future holds a tensor list");
    expect(value.toTensorList().get(0).data_ptr() == t[0].data_ptr(), "the future holds the output tensor");
    expectEqual(t[0], at::full({16}, 4.0, at::kFloat), "two all_reduces of ones on 2 ranks");
    (void)rank;
  });
}

// A Work makes its future on the first getFuture(): asked for while the call runs (queued on the worker), after it
// ran inline, or racing its completion, the future settles exactly once, with the outputs or with the error.
TEST_CASE("backend Work: its future, made before or after the call ends, settles once with outputs or error",
          "[backend][work]") {
  // Synchronous calls here return their Work too (by default one that runs inline returns none: next test).
  tunedist::test::ScopedEnv always("TUNEDIST_SYNC_WORK", "always");
  runRanks(2, [&](int rank, BackendPtr& backend) {
    std::vector<at::Tensor> t{at::ones({64})};
    c10d::AllreduceOptions sync;
    sync.asyncOp = false;  // runs inline on this thread: the Work is done when allreduce returns
    auto inlineWork = backend->allreduce(t, sync);
    expect(inlineWork->isCompleted() && inlineWork->isSuccess(), "an inline call is done when it returns");
    auto late = inlineWork->getFuture();
    expect(late->completed() && !late->hasError(), "a future made after the call ended is completed");
    expect(late->value().toTensorList().get(0).data_ptr() == t[0].data_ptr(), "the late future holds the output");
    expect(inlineWork->getFuture().get() == late.get(), "getFuture returns one future");
    expectEqual(t[0], at::full({64}, 2.0, at::kFloat), "all_reduce of ones on 2 ranks");
    for (int i = 0; i < 300; ++i) {
      t[0].fill_(double(i + rank));
      auto work = backend->allreduce(t);  // asynchronous: the worker completes it while we ask for the future
      auto fut = work->getFuture();
      fut->wait();
      expect(work->isCompleted() && work->isSuccess() && !fut->hasError(), "queued call " + std::to_string(i));
      expect(fut->value().toTensorList().get(0).data_ptr() == t[0].data_ptr(), "the future holds the output");
      work->wait();
      expectEqual(t[0], at::full({64}, double(2 * i + 1), at::kFloat), "queued call " + std::to_string(i));
    }
    // A failed call: its future carries the error whenever it is made.
    std::vector<at::Tensor> bad{at::ones({rank == 0 ? 8 : 9})};
    auto failed = backend->allreduce(bad);
    auto early = failed->getFuture();
    std::string message;
    try {
      failed->wait();
    } catch (const c10::DistBackendError& e) {
      message = e.what();
    }
    expect(message.find("disagree") != std::string::npos, "the mismatch error: " + message);
    expect(failed->isCompleted() && !failed->isSuccess(), "a failed Work is completed, not successful");
    expect(early->completed() && early->hasError(), "the future made before the failure carries the error");
    auto after = backend->allreduce(bad, sync);
    auto afterFuture = after->getFuture();
    expect(after->isCompleted() && !after->isSuccess() && afterFuture->hasError(),
           "a future made after an inline failure carries the error");
    expect(afterFuture->tryRetrieveErrorMessage().find("earlier failure") != std::string::npos,
           "the later call's error: " + afterFuture->tryRetrieveErrorMessage());
  });
}

// A synchronous call (asyncOp false) that runs inline returns no Work, as torch allows a backend that synchronised
// at the C++ level; its failure comes out of the call itself. One that finds the queue busy is queued and returns
// its Work: rank 0 queues an all_reduce its peer has not started, so its synchronous broadcast right after cannot run
// inline (it would block on the peer, which waits for rank 0's go-ahead: a bug shows as both ranks' timeouts).
TEST_CASE("backend: a synchronous call that runs inline returns no Work and throws its own failure",
          "[backend][work]") {
  std::atomic<bool> go{false};
  runRanks(2, [&](int rank, BackendPtr& backend) {
    c10d::AllreduceOptions sync;
    sync.asyncOp = false;
    std::vector<at::Tensor> t{at::full({33}, double(rank + 1))};
    expect(!backend->allreduce(t, sync), "an inline synchronous all_reduce returns no Work");
    expectEqual(t[0], at::full({33}, 3.0, at::kFloat), "all_reduce of 1 and 2");
    c10d::BroadcastOptions syncBroadcast;
    syncBroadcast.asyncOp = false;
    if (rank == 0) {
      auto pending = backend->allreduce(t);  // asynchronous; the peer joins only after `go`
      auto queued = backend->broadcast(t, syncBroadcast);
      expect(static_cast<bool>(queued), "a synchronous call behind a pending one is queued and returns its Work");
      go = true;
      pending->wait();
      queued->wait();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + kTimeout;
      while (!go) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw std::runtime_error("rank 0 never gave the go-ahead (it failed or blocked before)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      backend->allreduce(t)->wait();
      if (auto work = backend->broadcast(t, syncBroadcast)) {  // may find its own all_reduce still settling
        work->wait();
      }
    }
    expectEqual(t[0], at::full({33}, 6.0, at::kFloat), "the all_reduce then broadcast");
    std::vector<at::Tensor> bad{at::ones({rank == 0 ? 8 : 9})};
    std::string message;
    try {
      auto none = backend->allreduce(bad, sync);
      message = none ? "returned a Work" : "returned without an error";
    } catch (const c10::DistBackendError& e) {
      message = e.what();
    }
    expect(message.find("disagree") != std::string::npos, "the mismatch, thrown by the call: " + message);
  });
}

TEST_CASE("backend: ranks that disagree on the size all fail naming the op, and the group stays failed",
          "[backend][faults]") {
  const int size = GENERATE(2, 3);
  runRanks(size, [&](int rank, BackendPtr& backend) {
    std::vector<at::Tensor> warm{at::ones({4})};
    backend->allreduce(warm)->wait();
    std::vector<at::Tensor> t{at::ones({rank == size - 1 ? 9 : 8})};
    std::string message;
    try {
      backend->allreduce(t)->wait();
    } catch (const c10::DistBackendError& e) {
      message = e.what();
    }
    expect(message.find("all_reduce") != std::string::npos && message.find("disagree") != std::string::npos,
           "mismatch error: " + message);
    std::string later;
    try {
      backend->allreduce(warm)->wait();
    } catch (const c10::DistBackendError& e) {
      later = e.what();
    }
    expect(later.find("earlier failure") != std::string::npos, "the next call: " + later);
  });
}

TEST_CASE("backend: a caller error names the op and the rank once, in front", "[backend][faults]") {
  // Each case on a group of its own: a caller error fails the group.
  auto messageOf = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  auto count = [](const std::string& text, const std::string& word) {
    size_t n = 0;
    for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) {
      ++n;
    }
    return n;
  };
  runRanks(1, [&](int, BackendPtr& backend) {
    std::vector<at::Tensor> t{at::ones({4})};
    c10d::BroadcastOptions options;
    options.rootRank = 5;
    const std::string message = messageOf([&] { backend->broadcast(t, options); });
    expect(message.rfind("tunedist: broadcast: rank 0 of 1: root 5 is outside the group of 1", 0) == 0 &&
               count(message, "broadcast") == 1,
           "a root outside the group: " + message);
  });
  runRanks(1, [&](int, BackendPtr& backend) {
    std::vector<at::Tensor> t{at::ones({4}, at::kComplexFloat)};
    const std::string message = messageOf([&] { backend->allreduce(t); });
    expect(message.rfind("tunedist: all_reduce: rank 0 of 1: cannot reduce tensors of dtype ComplexFloat", 0) == 0 &&
               count(message, "all_reduce") == 1,
           "a dtype the engine cannot reduce: " + message);
  });
  runRanks(1, [&](int, BackendPtr& backend) {
    std::vector<at::Tensor> t{at::ones({4})};
    c10d::ReduceOptions options;
    options.reduceOp = c10d::ReduceOp::BAND;
    const std::string message = messageOf([&] { backend->reduce(t, options); });
    expect(message.rfind("tunedist: reduce: rank 0 of 1: BAND is not defined for float32", 0) == 0 &&
               count(message, "reduce: ") == 1,
           "a bitwise reduce of a float tensor: " + message);
  });
}
