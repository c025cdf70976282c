// Run-time choice of the kernels' SIMD level, validation of reduce() arguments, and the entry points.
#include "kernels/reduce.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "kernels/kernel_table_impl.h"

namespace tunedist::kernels {
namespace {

// A level forced by forceSimdLevel(), or kNotForced. The only mutable process-wide state of the kernels: the level
// is a property of the process (like the CPU), and tests flip it while other threads may be reducing.
constexpr int kNotForced = -1;
std::atomic<int> gForcedLevel{kNotForced};

bool cpuSupports(SimdLevel level) {
  // Normally done by libgcc before main; repeated here in case we are first called from a static initialiser.
  __builtin_cpu_init();
  switch (level) {
    case SimdLevel::kScalar: return true;
    case SimdLevel::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case SimdLevel::kAvx512:
      // The AVX-512 build is compiled with -mavx512dq and -mf16c as well, so those are required too.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c");
  }
  return false;
}

void checkCpuSupports(SimdLevel level, const char* source) {
  TD_CHECK(cpuSupports(level), source, " asks for SIMD level '", simdLevelName(level),
           "' but this CPU supports at most '", simdLevelName(detectSimdLevel()), "'");
}

// TUNEDIST_SIMD parsed, or kNotForced when unset or empty. Throws for a value that is not a level.
int readEnvLevel() {
  const auto env = core::envString("TUNEDIST_SIMD");
  if (!env) return kNotForced;
  const char* value = env->c_str();
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (std::strcmp(value, simdLevelName(level)) == 0) {
      checkCpuSupports(level, ("TUNEDIST_SIMD=" + std::string(value)).c_str());
      return static_cast<int>(level);
    }
  }
  TD_CHECK(false, "TUNEDIST_SIMD=", value, " is not a SIMD level (expected scalar, avx2 or avx512)");
  return kNotForced;
}

}  // namespace

const KernelTable& activeKernelTable() {
  switch (activeSimdLevel()) {
    case SimdLevel::kScalar: return scalar::kKernelTable;
    case SimdLevel::kAvx2: return avx2::kKernelTable;
    case SimdLevel::kAvx512: return avx512::kKernelTable;
  }
  TD_ASSERT(false, "unknown SIMD level");
  return scalar::kKernelTable;
}

bool rangesOverlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

namespace {
// Whether reducing a single term gives that term back unchanged (so a one-source reduce in place has nothing to do,
// as a world-size-1 all-reduce): every op but a scaling AVG or PREMUL_SUM. Bool is excluded: its kernel normalises
// any nonzero byte to 1.
bool keepsOneTerm(const ReduceArgs& args) {
  if (args.dtype == core::DType::kBool) return false;
  switch (args.op) {
    case core::RedOp::kAvg: return args.divisor == 1;
    case core::RedOp::kPremulSum: return args.factor == 1.0;
    default: return true;
  }
}

}  // namespace

const char* simdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "unknown-simd-level";
}

SimdLevel detectSimdLevel() {
  // Constant for the life of the process; a function-local static is initialised once, thread-safely.
  static const SimdLevel kDetected = cpuSupports(SimdLevel::kAvx512) ? SimdLevel::kAvx512
                                     : cpuSupports(SimdLevel::kAvx2) ? SimdLevel::kAvx2
                                                                     : SimdLevel::kScalar;
  return kDetected;
}

SimdLevel activeSimdLevel() {
  // Read once: the environment is the user's choice at launch. A bad value throws here on every call (the static
  // stays uninitialised), so every reduce reports it rather than only the first.
  static const int kEnvLevel = readEnvLevel();
  if (kEnvLevel != kNotForced) return static_cast<SimdLevel>(kEnvLevel);
  const int forced = gForcedLevel.load(std::memory_order_acquire);
  if (forced != kNotForced) return static_cast<SimdLevel>(forced);
  return detectSimdLevel();
}

void forceSimdLevel(SimdLevel level) {
  TD_CHECK(level == SimdLevel::kScalar || level == SimdLevel::kAvx2 || level == SimdLevel::kAvx512,
           "forceSimdLevel: unknown SIMD level code ", static_cast<int>(level));
  checkCpuSupports(level, "forceSimdLevel");
  gForcedLevel.store(static_cast<int>(level), std::memory_order_release);
}

void resetSimdLevel() { gForcedLevel.store(kNotForced, std::memory_order_release); }

void checkReduceSupported(core::DType dtype, core::RedOp op) {
  TD_CHECK(static_cast<int>(dtype) < core::kNumDTypes, "reduce: unknown dtype code ", static_cast<int>(dtype));
  TD_CHECK(static_cast<int>(op) < kernels::kNumRedOps, "reduce: unknown op code ", static_cast<int>(op));
  const bool bitwise = op == core::RedOp::kBand || op == core::RedOp::kBor || op == core::RedOp::kBxor;
  TD_CHECK(!(bitwise && core::isFloating(dtype)), core::redOpName(op), " is not defined for ", core::dtypeName(dtype),
           " (bitwise ops need an integer or bool tensor)");
  TD_CHECK(!(dtype == core::DType::kBool && (op == core::RedOp::kAvg || op == core::RedOp::kPremulSum)),
           core::redOpName(op), " is not defined for bool");
  // NCCL converts the factor to the element type for integers, which rounds it to an integer; rather than pick one
  // of several plausible meanings, integer PREMUL_SUM is refused.
  TD_CHECK(!(op == core::RedOp::kPremulSum && !core::isFloating(dtype)), "PREMUL_SUM is not supported for ",
           core::dtypeName(dtype), " (floating types only)");
}

void reduce(const ReduceArgs& args, void* out, const void* const* srcs, int nsrc, size_t count) {
  checkReduceSupported(args.dtype, args.op);
  TD_CHECK(nsrc >= 1 && nsrc <= kernels::kMaxReduceSources, "reduce: ", core::redOpName(args.op), " on ",
           core::dtypeName(args.dtype), " needs between 1 and ", kernels::kMaxReduceSources, " sources, got ", nsrc);
  TD_CHECK(args.op != core::RedOp::kAvg || args.divisor >= 1, "reduce: AVG on ", core::dtypeName(args.dtype),
           " needs divisor >= 1, got ", args.divisor);
  if (count == 0) return;
  TD_CHECK(out != nullptr && srcs != nullptr, "reduce: ", core::redOpName(args.op), " on ", core::dtypeName(args.dtype),
           ": null output or source list");
  const size_t bytes = count * core::dtypeSize(args.dtype);
  for (int s = 0; s < nsrc; ++s) {
    TD_CHECK(srcs[s] != nullptr, "reduce: source ", s, " is null");
    TD_CHECK(srcs[s] == out || !rangesOverlap(srcs[s], out, bytes), "reduce: output partially overlaps source ", s,
             " (it may only be the same buffer or disjoint)");
  }
  const kernels::ReduceFn fn =
      kernels::activeKernelTable().reduce[static_cast<int>(args.dtype)][static_cast<int>(args.op)];
  TD_ASSERT(fn != nullptr, "no kernel for ", core::redOpName(args.op), " on ", core::dtypeName(args.dtype));
  // After the checks above (and the SIMD level's, which reports a bad TUNEDIST_SIMD on every call).
  if (nsrc == 1 && srcs[0] == out && keepsOneTerm(args)) return;
  fn(args, out, srcs, nsrc, count);
}

void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  kernels::activeKernelTable().copy(dst, src, bytes);
}

void copyBytesCached(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  std::memcpy(dst, src, bytes);
}

void copyBytesTwice(void* shared, void* own, const void* src, size_t bytes, bool streamShared, bool streamOwn) {
  if (bytes == 0) return;
  TD_CHECK(!rangesOverlap(shared, src, bytes) && !rangesOverlap(own, src, bytes) && !rangesOverlap(shared, own, bytes),
           "copyBytesTwice: the slot, the own block and the source must not overlap");
  kernels::activeKernelTable().copyTwice(shared, own, src, bytes, streamShared, streamOwn);
}

}  // namespace tunedist::kernels
