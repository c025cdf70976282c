// all_reduce, reduce and reduce_scatter: every dtype x op x world size x count against closed-form expected
// values; in-place calls; and bit-identical floating-point results on every rank.
#include <catch2/catch.hpp>

#include "shm_test_dtypes.h"
#include "shm_test_util.h"

namespace tunedist::test {
namespace {

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,   DType::kInt64,   DType::kUInt8,
                                DType::kInt8,    DType::kBool,    DType::kFloat16, DType::kBFloat16};
constexpr double kPremulFactor = 0.5;

bool isBitwise(RedOp op) { return op == RedOp::kBand || op == RedOp::kBor || op == RedOp::kBxor; }

std::vector<RedOp> opsFor(DType t) {
  if (t == DType::kBool) {
    return {RedOp::kSum, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kBand, RedOp::kBor, RedOp::kBxor};
  }
  if (core::isFloating(t)) {
    return {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kPremulSum};
  }
  return {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin, RedOp::kMax, RedOp::kBand, RedOp::kBor, RedOp::kBxor};
}

// Empty, one element, odd, just past the one-shot limit (two-shot with uneven and empty slices), and five elements
// more than three slots hold.
std::vector<size_t> countsFor(DType t, const ShmOptions& o) {
  const size_t es = core::dtypeSize(t);
  return {0, 1, 1001, o.oneShotMaxBytes / es + 3, 3 * o.slotBytes / es + 5};
}

double signAt(DType t, size_t i) { return isSignedType(t) && i % 2 == 1 ? -1.0 : 1.0; }

// Rank r's element i: small integers, exact in every dtype. For SUM, AVG, PREMUL_SUM, MIN and MAX it is
// s * (r + 1 + i % 11), s = -1 at odd i for signed types, so that over P ranks SUM = s * (P(P+1)/2 + P * (i % 11)),
// at most 116 in magnitude for 8 ranks (exact in int8 and bf16).
double input(DType t, RedOp op, int r, size_t i) {
  const size_t ur = size_t(r);
  if (t == DType::kBool) {
    // All true, all false, or mixed across ranks.
    return i % 4 == 0 ? 1.0 : i % 4 == 1 ? 0.0 : double((i / 4 + ur) % 3 != 0);
  }
  if (op == RedOp::kProduct) {
    // Factors 1 or 2 (at most three 2s among 8 ranks), some negative.
    return ((ur + i) % 3 == 0 ? 2.0 : 1.0) * (isSignedType(t) && (ur + 2 * i) % 5 == 1 ? -1.0 : 1.0);
  }
  if (isBitwise(op)) {
    return double((i * 37 + ur * 11 + (i >> 5)) & 0x7f);
  }
  return signAt(t, i) * double(r + 1 + int(i % 11));
}

// PRODUCT, the bitwise ops and bool: the fold over ranks (the definition); everything else: closed forms.
double fold(DType t, RedOp op, int size, size_t i) {
  auto bits = [](double v) { return int64_t(v); };
  double acc = input(t, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double x = input(t, op, r, i);
    const bool orLike = op == RedOp::kSum || op == RedOp::kMax || op == RedOp::kBor;
    if (t == DType::kBool) {
      acc = op == RedOp::kBxor ? double((acc != 0) != (x != 0))
            : orLike           ? double(acc != 0 || x != 0)
                               : double(acc != 0 && x != 0);
    } else if (op == RedOp::kProduct) {
      acc *= x;
    } else {
      acc = double(op == RedOp::kBand  ? bits(acc) & bits(x)
                   : op == RedOp::kBor ? bits(acc) | bits(x)
                                       : bits(acc) ^ bits(x));
    }
  }
  return acc;
}

double expected(DType t, RedOp op, int size, size_t i) {
  if (t == DType::kBool || op == RedOp::kProduct || isBitwise(op)) {
    return fold(t, op, size, i);
  }
  const double s = signAt(t, i);
  const double k = double(i % 11);
  const double p = size;
  const double sum = s * (p * (p + 1) / 2 + p * k);
  switch (op) {
    case RedOp::kSum: return sum;
    case RedOp::kAvg: return core::isFloating(t) ? sum / p : double(int64_t(sum) / int64_t(size));
    case RedOp::kPremulSum: return kPremulFactor * sum;
    case RedOp::kMin: return s > 0 ? 1 + k : -(p + k);  // rank 0's value, or rank P-1's when negative
    case RedOp::kMax: return s > 0 ? p + k : -(1 + k);
    default: break;
  }
  throw core::Error("test: no expected value for this op");
}

ReduceArgs argsFor(DType t, RedOp op, int size) {
  ReduceArgs a;
  a.dtype = t;
  a.op = op;
  a.factor = op == RedOp::kPremulSum ? kPremulFactor : 1.0;
  a.divisor = size;
  return a;
}

std::string caseName(const char* coll, DType t, RedOp op, int size, size_t count) {
  return core::detail::str(coll, " ", core::dtypeName(t), " ", core::redOpName(op), ", ", size, " ranks, count ",
                           count);
}

// Rank r's input: `count` elements starting at global index `first` (never a null pointer).
std::vector<uint8_t> makeInput(DType t, RedOp op, int r, size_t count, size_t first = 0) {
  std::vector<uint8_t> buf(std::max<size_t>(count, 1) * core::dtypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    storeValue(t, buf.data(), i, input(t, op, r, first + i));
  }
  return buf;
}

void checkReduced(const std::string& what, int rank, DType t, RedOp op, int size, const void* out, size_t count,
                  size_t first = 0) {
  for (size_t i = 0; i < count; ++i) {
    const double got = loadValue(t, out, i);
    const double want = expected(t, op, size, first + i);
    if (!(got == want)) {
      failAt(what, rank, i, got, want);
    }
  }
}

void allreduceMatrix(Peer& p, const ShmOptions& o) {
  for (DType t : kAllDTypes) {
    for (RedOp op : opsFor(t)) {
      for (size_t count : countsFor(t, o)) {
        const std::string what = caseName("all_reduce", t, op, p.size(), count);
        auto in = makeInput(t, op, p.rank(), count);
        Output out(t, count);
        p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, argsFor(t, op, p.size()));
        out.checkGuard(what, p.rank());
        checkReduced(what, p.rank(), t, op, p.size(), out.data(), count);
      }
    }
  }
}

// The root moves with every case; `out` is null on the other ranks (the engine must not touch it there).
void reduceMatrix(Peer& p, const ShmOptions& o) {
  int root = 0;
  for (DType t : kAllDTypes) {
    for (RedOp op : opsFor(t)) {
      for (size_t count : countsFor(t, o)) {
        root = (root + 1) % p.size();
        const std::string what = caseName("reduce", t, op, p.size(), count) + core::detail::str(", root ", root);
        auto in = makeInput(t, op, p.rank(), count);
        Output out(t, count);
        void* dst = p.rank() == root ? out.data() : nullptr;
        p.comm.reduce(p.op("reduce"), in.data(), dst, count, argsFor(t, op, p.size()), root);
        if (p.rank() == root) {
          out.checkGuard(what, p.rank());
          checkReduced(what, p.rank(), t, op, p.size(), out.data(), count);
        }
      }
    }
  }
}

// Block q of every rank's input holds global indices [q * count, (q + 1) * count), so rank q's output is the
// closed form at those indices.
void reduceScatterMatrix(Peer& p, const ShmOptions& o) {
  const int size = p.size();
  for (DType t : kAllDTypes) {
    for (RedOp op : opsFor(t)) {
      for (size_t count : countsFor(t, o)) {
        const std::string what = caseName("reduce_scatter", t, op, size, count);
        std::vector<std::vector<uint8_t>> blocks;
        std::vector<const void*> ins;
        for (int q = 0; q < size; ++q) {
          blocks.push_back(makeInput(t, op, p.rank(), count, size_t(q) * count));
          ins.push_back(blocks.back().data());
        }
        Output out(t, count);
        p.comm.reduceScatter(p.op("reduce_scatter"), ins.data(), out.data(), count, argsFor(t, op, size));
        out.checkGuard(what, p.rank());
        checkReduced(what, p.rank(), t, op, size, out.data(), count, size_t(p.rank()) * count);
      }
    }
  }
}

// Inputs that no float format holds exactly. The expected bits follow the kernels' documented arithmetic: terms
// combined left to right from rank 0 in the accumulator type (float for fp16/bf16), rounded once at the end.
double fuzzy(int r, size_t i) { return 0.1 * double(r + 1) * double(1 + i % 13) + 1e-3 * double(i % 101); }

template <typename A>
A referenceElement(DType t, RedOp op, int size, size_t i) {
  auto term = [&](int r) {
    uint64_t cell = 0;
    storeValue(t, &cell, 0, fuzzy(r, i), /*exact=*/false);
    return A(loadValue(t, &cell, 0));
  };
  const A f = A(kPremulFactor);
  A acc = op == RedOp::kPremulSum ? term(0) * f : term(0);
  for (int r = 1; r < size; ++r) {
    const A x = term(r);
    acc = op == RedOp::kProduct ? acc * x : op == RedOp::kPremulSum ? acc + x * f : acc + x;
  }
  return op == RedOp::kAvg ? acc / A(size) : acc;
}

std::vector<uint8_t> referenceBits(DType t, RedOp op, int size, size_t count) {
  std::vector<uint8_t> out(count * core::dtypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    if (t == DType::kFloat64) {
      storeValue(t, out.data(), i, referenceElement<double>(t, op, size, i));
    } else {
      storeValue(t, out.data(), i, double(referenceElement<float>(t, op, size, i)), /*exact=*/false);
    }
  }
  return out;
}

void checkBits(const std::string& what, int rank, DType t, const void* got, const std::vector<uint8_t>& want) {
  if (std::memcmp(got, want.data(), want.size()) == 0) {
    return;
  }
  const size_t es = core::dtypeSize(t);
  for (size_t i = 0; i * es < want.size(); ++i) {
    if (std::memcmp(static_cast<const uint8_t*>(got) + i * es, want.data() + i * es, es) != 0) {
      failAt(what + " (bitwise)", rank, i, loadValue(t, got, i), loadValue(t, want.data(), i));
    }
  }
}

}  // namespace

TEST_CASE("test helpers: fp16 and bf16 conversions round to nearest even", "[shm][helpers]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const bool halfFinite = ((b >> 10) & 0x1f) != 0x1f;
    const bool bf16Finite = ((b >> 7) & 0xff) != 0xff;
    if (halfFinite && halfBits(halfValue(uint16_t(b))) != b) {
      FAIL("fp16 bits " << b << " do not survive a round trip");
    }
    if (bf16Finite && bf16Bits(bf16Value(uint16_t(b))) != b) {
      FAIL("bf16 bits " << b << " do not survive a round trip");
    }
  }
  CHECK(halfBits(1.0 + 1.0 / 2048) == 0x3c00);      // tie: to even (down)
  CHECK(halfBits(1.0 + 3.0 / 2048) == 0x3c02);      // tie: to even (up)
  CHECK(halfBits(65519.0) == 0x7bff);               // largest finite
  CHECK(halfBits(65520.0) == 0x7c00);               // rounds to infinity
  CHECK(halfBits(std::ldexp(1.0, -25)) == 0x0000);  // tie between 0 and the smallest subnormal
  CHECK(halfBits(std::ldexp(3.0, -25)) == 0x0002);  // tie: to even
  CHECK(halfValue(0x0001) == std::ldexp(1.0, -24));
  CHECK(bf16Bits(1.0 + 1.0 / 256) == 0x3f80);  // tie: to even (down)
  CHECK(bf16Bits(1.0 + 3.0 / 256) == 0x3f82);  // tie: to even (up)
  CHECK(bf16Value(0x3f81) == 1.0 + 1.0 / 128);
}

TEST_CASE("all_reduce matches the closed form for every dtype, op and count", "[shm][all_reduce]") {
  const int size = GENERATE(1, 2, 3, 4, 8);
  const bool medium = GENERATE(false, true);
  const ShmOptions o = medium ? mediumOptions() : smallOptions();
  INFO("world size " << size << ", slot " << o.slotBytes << ", one-shot up to " << o.oneShotMaxBytes);
  ShmLeakCheck leaks;
  runGroup(size, o, [&](Peer& p) { allreduceMatrix(p, o); });
  CHECK(leaks.report() == "");
}

TEST_CASE("reduce matches the closed form on the root for every dtype, op and count", "[shm][reduce]") {
  const int size = GENERATE(1, 2, 3, 4);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runGroup(size, smallOptions(), [&](Peer& p) { reduceMatrix(p, smallOptions()); });
  CHECK(leaks.report() == "");
}

TEST_CASE("reduce_scatter matches the closed form for every dtype, op and count", "[shm][reduce_scatter]") {
  const int size = GENERATE(1, 2, 3, 4);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runGroup(size, smallOptions(), [&](Peer& p) { reduceScatterMatrix(p, smallOptions()); });
  CHECK(leaks.report() == "");
}

TEST_CASE("reductions with the default options", "[shm][all_reduce][reduce][reduce_scatter]") {
  const int size = GENERATE(2, 3);
  const ShmOptions o;
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runGroup(size, o, [&](Peer& p) {
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
      // One-shot, just past the one-shot limit, and just past one slot.
      for (size_t count : {size_t(0), size_t(1), size_t(1001), o.oneShotMaxBytes / core::dtypeSize(t) + 3,
                           o.slotBytes / core::dtypeSize(t) + 5}) {
        const std::string what = caseName("all_reduce", t, RedOp::kSum, size, count);
        auto in = makeInput(t, RedOp::kSum, p.rank(), count);
        Output out(t, count);
        p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, argsFor(t, RedOp::kSum, size));
        out.checkGuard(what, p.rank());
        checkReduced(what, p.rank(), t, RedOp::kSum, size, out.data(), count);
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("in-place all_reduce (one-shot and two-shot) and reduce_scatter", "[shm][in_place]") {
  const int size = GENERATE(1, 2, 3, 4, 8);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  runGroup(size, smallOptions(), [&](Peer& p) {
    for (DType t : {DType::kFloat32, DType::kInt8, DType::kBFloat16}) {
      for (RedOp op : {RedOp::kSum, RedOp::kMax}) {
        for (size_t count : countsFor(t, smallOptions())) {
          const std::string what = caseName("in-place all_reduce", t, op, size, count);
          auto buf = makeInput(t, op, p.rank(), count);
          p.comm.allreduce(p.op("all_reduce"), buf.data(), buf.data(), count, argsFor(t, op, size));
          checkReduced(what, p.rank(), t, op, size, buf.data(), count);
          // One contiguous input, as torch passes it; the output is our own block of it.
          const std::string rsWhat = caseName("in-place reduce_scatter", t, op, size, count);
          const size_t es = core::dtypeSize(t);
          auto all = makeInput(t, op, p.rank(), count * size_t(size));
          const auto original = all;
          std::vector<const void*> ins;
          for (int q = 0; q < size; ++q) {
            ins.push_back(all.data() + size_t(q) * count * es);
          }
          void* out = all.data() + size_t(p.rank()) * count * es;
          p.comm.reduceScatter(p.op("reduce_scatter"), ins.data(), out, count, argsFor(t, op, size));
          checkReduced(rsWhat, p.rank(), t, op, size, out, count, size_t(p.rank()) * count);
          for (size_t j = 0; j < count * size_t(size) * es; ++j) {
            if (j / (count * es) != size_t(p.rank()) && all[j] != original[j]) {
              failAt(rsWhat + " (another rank's input block changed)", p.rank(), j, int(all[j]), int(original[j]));
            }
          }
        }
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("floating-point reductions are bit-identical on every rank and follow the documented order",
          "[shm][all_reduce][reduce][bitwise]") {
  const int size = GENERATE(2, 3, 4, 8);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  std::vector<std::vector<uint8_t>> results(static_cast<size_t>(size));
  runGroup(size, smallOptions(), [&](Peer& p) {
    std::vector<uint8_t>& mine = results[size_t(p.rank())];
    for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      for (RedOp op : {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kPremulSum}) {
        // One-shot (127 elements fit 1 KiB), two-shot in one chunk, two-shot over several chunks.
        for (size_t count : {size_t(127), size_t(1001), 3 * smallOptions().slotBytes / core::dtypeSize(t) + 5}) {
          const std::string what = caseName("all_reduce", t, op, size, count);
          std::vector<uint8_t> in(count * core::dtypeSize(t));
          for (size_t i = 0; i < count; ++i) {
            storeValue(t, in.data(), i, fuzzy(p.rank(), i), /*exact=*/false);
          }
          const auto want = referenceBits(t, op, size, count);
          Output out(t, count);
          p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, argsFor(t, op, size));
          checkBits(what, p.rank(), t, out.data(), want);
          mine.insert(mine.end(), static_cast<const uint8_t*>(out.data()),
                      static_cast<const uint8_t*>(out.data()) + want.size());
          const int root = size - 1;
          p.comm.reduce(p.op("reduce"), in.data(), p.rank() == root ? out.data() : nullptr, count, argsFor(t, op, size),
                        root);
          if (p.rank() == root) {
            checkBits(caseName("reduce", t, op, size, count), p.rank(), t, out.data(), want);
          }
        }
      }
    }
  });
  for (int r = 1; r < size; ++r) {
    INFO("rank " << r << " against rank 0");
    REQUIRE(results[size_t(r)].size() == results[0].size());
    CHECK(std::memcmp(results[size_t(r)].data(), results[0].data(), results[0].size()) == 0);
  }
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
