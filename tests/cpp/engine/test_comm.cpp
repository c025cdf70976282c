// The data-movement collectives (broadcast, all_gather, gather, scatter, all_to_all, barrier) over world sizes
// 1-4 and counts from 0 to several slots, in-place all_gather, and long mixed sequences on one or two groups.
#include <catch2/catch.hpp>

#include <atomic>
#include <numeric>
#include <random>

#include "shm_test_util.h"

namespace tunedist::test {
namespace {

// Small slots (every multi-round path) or the defaults. Byte counts: empty, one, odd, and more than three slots
// (more than one with the defaults' 1 MiB slots). Every root with small slots; the last rank with the defaults.
struct Profile {
  ShmOptions options;
  std::vector<size_t> counts;
  bool allRoots;
  std::vector<int> roots(int size) const {
    std::vector<int> r(allRoots ? size_t(size) : 1, size - 1);
    std::iota(r.begin(), r.end(), allRoots ? 0 : size - 1);
    return r;
  }
};

Profile profile(bool defaults) {
  Profile p{defaults ? ShmOptions() : smallOptions(), {}, !defaults};
  const size_t big = defaults ? p.options.slotBytes + 5 : 3 * p.options.slotBytes + 5;
  p.counts = {0, 1, 1001, big};
  return p;
}

std::string caseName(const std::string& coll, int size, size_t bytes, int root = -1) {
  return core::detail::str(coll, ", ", size, " ranks, ", bytes, " bytes",
                           root >= 0 ? core::detail::str(", root ", root) : "");
}

void broadcastCase(Peer& p, size_t bytes, int root, int salt) {
  const std::string what = caseName("broadcast", p.size(), bytes, root);
  std::vector<uint8_t> buf = p.rank() == root ? patternBytes(root, bytes, salt) : std::vector<uint8_t>(bytes, 0xA5);
  p.comm.broadcast(p.op("broadcast"), bytes ? buf.data() : nullptr, bytes, root);
  checkPattern(what, p.rank(), buf.data(), bytes, root, salt);
}

// Where a gather's input lives: its own buffer, exactly its own block of the output (FSDP2's in-place
// all-gather), or, on rank 0, half a block before its own block so that the two partially overlap (the backend
// clones only inputs that overlap a peer's block; one that overlaps its own must be read before that block is
// written). Other ranks use their own buffer in the shifted case.
enum class Src { kSeparate, kOwnBlock, kShiftedOwn };

// root < 0: all_gather. Outputs are blocks of one contiguous buffer, as torch passes them, after `lead` bytes
// where rank 0's shifted input may start.
void gatherCase(Peer& p, size_t bytes, int root, Src where, int salt) {
  const bool all = root < 0;
  const char* how = where == Src::kOwnBlock ? "in-place " : where == Src::kShiftedOwn ? "shifted-input " : "";
  const std::string what = caseName(core::detail::str(how, all ? "all_gather" : "gather"), p.size(), bytes, root);
  const size_t size = size_t(p.size());
  const size_t lead = bytes / 2 + 1;
  std::vector<uint8_t> buf(lead + bytes * size + 64, 0xA5);
  uint8_t* out = buf.data() + lead;
  std::vector<void*> outs;
  for (size_t q = 0; q < size; ++q) {
    outs.push_back(out + q * bytes);
  }
  std::vector<uint8_t> in = patternBytes(p.rank(), bytes, salt);
  const void* src = in.data();
  if (where == Src::kOwnBlock) {
    std::copy(in.begin(), in.end(), static_cast<uint8_t*>(outs[size_t(p.rank())]));
    src = outs[size_t(p.rank())];
  } else if (where == Src::kShiftedOwn && p.rank() == 0 && bytes > 0) {
    std::copy(in.begin(), in.end(), out - lead);
    src = out - lead;
  }
  const std::vector<uint8_t> before = buf;
  if (all) {
    p.comm.allgather(p.op("all_gather"), src, bytes, outs.data());
  } else {
    p.comm.gather(p.op("gather"), src, bytes, p.rank() == root ? outs.data() : nullptr, root);
  }
  const bool receives = all || p.rank() == root;
  if (receives) {
    for (size_t q = 0; q < size; ++q) {
      checkPattern(what, p.rank(), static_cast<uint8_t*>(outs[q]), bytes, int(q), salt);
    }
  }
  // Every byte outside the blocks this rank receives keeps what it held: the guards before and after the output
  // (rank 0's shifted input in the lead, untouched by the call), or the whole buffer on a rank that receives nothing.
  for (size_t i = 0; i < buf.size(); ++i) {
    const bool output = receives && i >= lead && i < lead + bytes * size;
    if (!output && buf[i] != before[i]) {
      failAt(what + (i < lead ? " (bytes before the output)" : " (bytes past the output)"), p.rank(), i, int(buf[i]),
             int(before[i]));
    }
  }
}

// The root's block for rank q is pattern(q, salt): every rank checks it received its own.
void scatterCase(Peer& p, size_t bytes, int root, int salt) {
  const std::string what = caseName("scatter", p.size(), bytes, root);
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<const void*> ins;
  for (int q = 0; q < p.size(); ++q) {
    blocks.push_back(patternBytes(q, bytes, salt));
    ins.push_back(blocks.back().data());
  }
  std::vector<uint8_t> out(bytes, 0xA5);
  p.comm.scatter(p.op("scatter"), p.rank() == root ? ins.data() : nullptr, out.data(), bytes, root);
  checkPattern(what, p.rank(), out.data(), bytes, p.rank(), salt);
}

// Bytes rank s sends to rank d: `n` each when even, else 0, n/2, n or 3n/2 (zero-size pairs included).
size_t pairBytes(int s, int d, size_t n, bool even) { return even ? n : size_t((s * 3 + d * 5) % 4) * n / 2; }

// Send and receive blocks are slices of one contiguous buffer each (as torch's all_to_all_single passes them);
// the block from s to d is pattern(s, salt d).
void alltoallCase(Peer& p, size_t n, bool even) {
  const int size = p.size();
  const int me = p.rank();
  const std::string what = caseName(even ? "all_to_all (even)" : "all_to_all (uneven)", size, n);
  std::vector<size_t> sendBytes, recvBytes, sendOff{0}, recvOff{0};
  for (int q = 0; q < size; ++q) {
    sendBytes.push_back(pairBytes(me, q, n, even));
    recvBytes.push_back(pairBytes(q, me, n, even));
    sendOff.push_back(sendOff.back() + sendBytes.back());
    recvOff.push_back(recvOff.back() + recvBytes.back());
  }
  std::vector<uint8_t> send(sendOff.back() + 1), recv(recvOff.back() + 1, 0xA5);
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  for (int q = 0; q < size; ++q) {
    auto block = patternBytes(me, sendBytes[size_t(q)], q);
    std::copy(block.begin(), block.end(), send.begin() + long(sendOff[size_t(q)]));
    sends.push_back(send.data() + sendOff[size_t(q)]);
    recvs.push_back(recv.data() + recvOff[size_t(q)]);
  }
  p.comm.alltoallv(p.op("all_to_all"), sends.data(), sendBytes.data(), recvs.data(), recvBytes.data());
  for (int q = 0; q < size; ++q) {
    checkPattern(what, me, static_cast<uint8_t*>(recvs[size_t(q)]), recvBytes[size_t(q)], q, me);
  }
  if (recv.back() != 0xA5) {
    failAt(what + " (guard past the output)", me, recv.size() - 1, int(recv.back()), 0xA5);
  }
}

// One float32 SUM all_reduce whose inputs depend on `salt`, so stale slot contents from an earlier op show.
// Rank r's element i is r + 1 + (i + salt) % 11; the sum over P ranks is P(P+1)/2 + P * ((i + salt) % 11).
void allreduceSumCase(Peer& p, size_t count, int salt) {
  std::vector<float> in(count + 1), out(count + 1, -1.0f);
  for (size_t i = 0; i < count; ++i) {
    in[i] = float(p.rank() + 1 + int((i + size_t(salt)) % 11));
  }
  ReduceArgs args;
  args.dtype = DType::kFloat32;
  args.op = RedOp::kSum;
  p.comm.allreduce(p.op("all_reduce"), in.data(), out.data(), count, args);
  const double n = p.size();
  for (size_t i = 0; i < count; ++i) {
    const double want = n * (n + 1) / 2 + n * double((i + size_t(salt)) % 11);
    if (out[i] != want) {
      failAt(core::detail::str("all_reduce sum float32, ", p.size(), " ranks, count ", count), p.rank(), i, out[i],
             want);
    }
  }
}

// A planned op: every rank draws the same plan from the seed, so the ranks call matching ops.
struct PlannedOp {
  int kind;
  size_t count;
  int root;
  int salt;
};
constexpr int kNumKinds = 8;

std::vector<PlannedOp> planOps(uint32_t seed, int n, int size, const ShmOptions& o) {
  std::mt19937 rng(seed);
  auto below = [&](size_t bound) { return size_t(rng() % bound); };
  std::vector<PlannedOp> plan;
  for (int k = 0; k < n; ++k) {
    PlannedOp op{int(below(kNumKinds)), 0, int(below(size_t(size))), k};
    // Empty, tiny, up to the one-shot limit, or up to four slots (bytes, or float32 elements for all_reduce).
    switch (below(4)) {
      case 0: op.count = below(2); break;
      case 1: op.count = below(64); break;
      case 2: op.count = below(o.oneShotMaxBytes / 4 + 1); break;
      default: op.count = below(o.slotBytes + 1); break;
    }
    plan.push_back(op);
  }
  return plan;
}

void runPlanned(Peer& p, const PlannedOp& op) {
  switch (op.kind) {
    case 0: return allreduceSumCase(p, op.count, op.salt);
    case 1: return allreduceSumCase(p, op.count * 4, op.salt);
    case 2: return broadcastCase(p, op.count, op.root, op.salt);
    case 3: return gatherCase(p, op.count, -1, op.salt % 2 == 0 ? Src::kOwnBlock : Src::kSeparate, op.salt);
    case 4: return gatherCase(p, op.count, op.root, Src::kSeparate, op.salt);
    case 5: return scatterCase(p, op.count, op.root, op.salt);
    case 6: return alltoallCase(p, op.count, op.salt % 2 == 0);
    default: return p.comm.barrier(p.op("barrier"));
  }
}

uint32_t testSeed() {
  const uint32_t given = Catch::rngSeed();
  return given != 0 ? given : std::random_device{}();
}

}  // namespace

TEST_CASE("broadcast delivers the root's bytes for every root and count", "[shm][broadcast]") {
  const int size = GENERATE(1, 2, 3, 4);
  const bool defaults = GENERATE(false, true);
  const Profile prof = profile(defaults);
  INFO("world size " << size << ", slot bytes " << prof.options.slotBytes);
  ShmLeakCheck leaks;
  runGroup(size, prof.options, [&](Peer& p) {
    for (size_t bytes : prof.counts) {
      for (int root : prof.roots(size)) {
        broadcastCase(p, bytes, root, root + int(bytes));
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("all_gather and gather deliver every rank's block", "[shm][all_gather][gather]") {
  const int size = GENERATE(1, 2, 3, 4);
  const bool defaults = GENERATE(false, true);
  // The own block in the copy-in's pass (the default from 0 bytes), or in a copy of its own.
  const bool fused = GENERATE(true, false);
  // The own block's stores: streaming whenever the ranges allow (0) or cached always (SIZE_MAX). The default rule
  // (stream above 2 MiB received) takes one of these two paths per operation, so it adds no path of its own here,
  // only a third pass over the whole matrix (a third of this test's time under TSan).
  const size_t ownCachedMax = GENERATE(size_t(0), SIZE_MAX);
  Profile prof = profile(defaults);
  if (!fused) prof.options.fusedOwnCopyMinBytes = SIZE_MAX;
  prof.options.ownCachedCopyMaxBytes = ownCachedMax;
  INFO("world size " << size << ", slot bytes " << prof.options.slotBytes << (fused ? ", fused" : ", own copy apart")
                     << ", own block cached up to " << ownCachedMax << " bytes received");
  ShmLeakCheck leaks;
  runGroup(size, prof.options, [&](Peer& p) {
    for (size_t bytes : prof.counts) {
      gatherCase(p, bytes, -1, Src::kSeparate, 1);
      gatherCase(p, bytes, -1, Src::kOwnBlock, 2);
      gatherCase(p, bytes, -1, Src::kShiftedOwn, 3);
      for (int root : prof.roots(size)) {
        gatherCase(p, bytes, root, Src::kSeparate, 4 + root);
        gatherCase(p, bytes, root, Src::kShiftedOwn, 4 + root);
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("scatter delivers each rank its block from every root", "[shm][scatter]") {
  const int size = GENERATE(1, 2, 3, 4);
  const bool defaults = GENERATE(false, true);
  const Profile prof = profile(defaults);
  INFO("world size " << size << ", slot bytes " << prof.options.slotBytes);
  ShmLeakCheck leaks;
  runGroup(size, prof.options, [&](Peer& p) {
    for (size_t bytes : prof.counts) {
      for (int root : prof.roots(size)) {
        scatterCase(p, bytes, root, root);
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("all_to_all with even and uneven splits, zero-size pairs included", "[shm][all_to_all]") {
  const int size = GENERATE(1, 2, 3, 4);
  const bool defaults = GENERATE(false, true);
  const Profile prof = profile(defaults);
  INFO("world size " << size << ", slot bytes " << prof.options.slotBytes);
  ShmLeakCheck leaks;
  runGroup(size, prof.options, [&](Peer& p) {
    for (size_t bytes : prof.counts) {
      alltoallCase(p, bytes, true);
      alltoallCase(p, bytes, false);
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("barrier returns only after every rank has entered it", "[shm][barrier]") {
  const int size = GENERATE(1, 2, 3, 4);
  INFO("world size " << size);
  ShmLeakCheck leaks;
  std::atomic<int> arrived{0};
  runGroup(size, smallOptions(), [&](Peer& p) {
    for (int round = 0; round < 20; ++round) {
      arrived.fetch_add(1);
      p.comm.barrier(p.op("barrier"));
      // Everyone has counted this round; nobody can have counted past the next one.
      const int seen = arrived.load();
      if (seen < size * (round + 1) || seen >= size * (round + 2)) {
        failCheck("barrier round ", round, ": rank ", p.rank(), " saw ", seen, " arrivals of ", size);
      }
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("200 random back-to-back ops mixing one-shot, two-shot and every collective", "[shm][sequence]") {
  const int size = GENERATE(2, 3, 4);
  const uint32_t seed = testSeed();
  INFO("world size " << size << ", seed " << seed << " (rerun with --rng-seed " << seed << ")");
  ShmLeakCheck leaks;
  const auto plan = planOps(seed, 200, size, smallOptions());
  runGroup(size, smallOptions(), [&](Peer& p) {
    for (const PlannedOp& op : plan) {
      runPlanned(p, op);
    }
  });
  CHECK(leaks.report() == "");
}

TEST_CASE("the random sequence with each rank copying into its slot its own way (cached, streaming, auto)",
          "[shm][sequence][slot_stores]") {
  const int size = GENERATE(2, 3, 4);
  const uint32_t seed = testSeed();
  INFO("world size " << size << ", seed " << seed << " (rerun with --rng-seed " << seed << ")");
  ShmLeakCheck leaks;
  // 8 KiB slots: whole-slot copies are long enough for the auto mode to time them.
  const auto plan = planOps(seed, 200, size, mediumOptions());
  auto rendezvous = std::make_shared<MemRendezvous>();
  rethrowFailures(spawn(size, [&](int r) {
    ShmOptions o = mediumOptions();
    const core::SlotStores modes[] = {core::SlotStores::kCached, core::SlotStores::kStreaming, core::SlotStores::kAuto};
    o.slotStores = modes[r % 3];
    Peer p(rendezvous, r, size, o);
    abortingOnThrow({&p.comm}, [&] {
      for (const PlannedOp& op : plan) {
        runPlanned(p, op);
      }
    });
  }));
  CHECK(leaks.report() == "");
}

TEST_CASE("two groups alive in the same threads, used alternately", "[shm][sequence][groups]") {
  const int size = GENERATE(2, 3);
  const uint32_t seed = testSeed();
  INFO("world size " << size << ", seed " << seed << " (rerun with --rng-seed " << seed << ")");
  ShmLeakCheck leaks;
  auto rendezvousA = std::make_shared<MemRendezvous>();
  auto rendezvousB = std::make_shared<MemRendezvous>();
  const auto planA = planOps(seed, 100, size, smallOptions());
  const auto planB = planOps(seed + 1, 100, size, mediumOptions());
  rethrowFailures(spawn(size, [&](int r) {
    Peer a(rendezvousA, r, size, smallOptions());
    Peer b(rendezvousB, r, size, mediumOptions());
    abortingOnThrow({&a.comm, &b.comm}, [&] {
      for (size_t k = 0; k < planA.size(); ++k) {
        runPlanned(a, planA[k]);
        runPlanned(b, planB[k]);
      }
    });
  }));
  CHECK(leaks.report() == "");
}

}  // namespace tunedist::test
