// Host topology: grouping ranks into hosts (labels split, never merge), the cross-host slicing of the
// hierarchical all-reduce for even and uneven layouts, and HostDiscovery's probe protocol over threads.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "shm_test_util.h"
#include "topology/host_discovery.h"
#include "topology/host_topology.h"

namespace tunedist::test {
namespace {

using topology::HostKey;
using topology::HostLayout;

std::vector<HostKey> keys(const std::vector<std::string>& labels, const std::vector<std::string>& fingerprints) {
  std::vector<HostKey> out;
  for (size_t i = 0; i < labels.size(); ++i) {
    out.push_back(HostKey{labels[i], fingerprints[i]});
  }
  return out;
}

TEST_CASE("ranks that share memory and have no label are one host", "[topology]") {
  HostLayout l = topology::groupRanksByHost(keys({"", "", ""}, {"m", "m", "m"}));
  REQUIRE(l.oneHost());
  REQUIRE(l.hosts[0] == std::vector<int>{0, 1, 2});
  REQUIRE(l.localRankOf == std::vector<int>{0, 1, 2});
}

TEST_CASE("labels split ranks that share memory, in any rank order", "[topology]") {
  HostLayout l = topology::groupRanksByHost(keys({"a", "b", "a", "b", "c"}, {"m", "m", "m", "m", "m"}));
  REQUIRE(l.numHosts() == 3);
  REQUIRE(l.hosts[0] == std::vector<int>{0, 2});
  REQUIRE(l.hosts[1] == std::vector<int>{1, 3});
  REQUIRE(l.hosts[2] == std::vector<int>{4});
  REQUIRE(l.hostOf == std::vector<int>{0, 1, 0, 1, 2});
  REQUIRE(l.localRankOf == std::vector<int>{0, 0, 1, 1, 0});
  REQUIRE(l.hostSizes() == std::vector<int>{2, 2, 1});
  REQUIRE(l.rankAt(1, 1) == 3);
}

TEST_CASE("ranks that cannot share memory are separate hosts without labels", "[topology]") {
  HostLayout l = topology::groupRanksByHost(keys({"", "", ""}, {"m1", "m2", "m1"}));
  REQUIRE(l.numHosts() == 2);
  REQUIRE(l.hosts[0] == std::vector<int>{0, 2});
  REQUIRE(l.hosts[1] == std::vector<int>{1});
}

TEST_CASE("a label never merges ranks that cannot share memory", "[topology]") {
  REQUIRE_THROWS_WITH(topology::groupRanksByHost(keys({"x", "x", "y"}, {"m1", "m2", "m2"})),
                      Catch::Contains("TUNEDIST_HOST_ID='x'") && Catch::Contains("rank 0 and rank 1") &&
                          Catch::Contains("cannot share memory"));
}

TEST_CASE("the fingerprint of this process's shared memory is stable and names the boot id", "[topology]") {
  std::string a = topology::shareableMemoryFingerprint("/dev/shm");
  REQUIRE(a == topology::shareableMemoryFingerprint("/dev/shm"));
  REQUIRE(a != topology::shareableMemoryFingerprint("/tmp"));
  REQUIRE_THROWS_WITH(topology::shareableMemoryFingerprint("/nonexistent-dir"), Catch::Contains("cannot stat"));
}

// Every element is in exactly one span, and its owner on each host is the position that HostSlicing gives it.
void checkSpans(size_t count, const std::vector<int>& sizes) {
  auto spans = topology::crossHostSpans(count, sizes);
  size_t next = 0;
  std::vector<size_t> load(size_t(std::accumulate(sizes.begin(), sizes.end(), 0)), 0);
  for (const auto& s : spans) {
    INFO("count " << count << ", span [" << s.begin << ", " << s.end << ")");
    REQUIRE(s.begin == next);
    REQUIRE(s.end > s.begin);
    REQUIRE(s.owners.size() == sizes.size());
    for (size_t h = 0; h < sizes.size(); ++h) {
      auto slicing = topology::HostSlicing::of(count, sizes[h]);
      REQUIRE(slicing.ownerOf(s.begin) == s.owners[h]);
      REQUIRE(slicing.ownerOf(s.end - 1) == s.owners[h]);
    }
    next = s.end;
  }
  REQUIRE(next == count);
}

TEST_CASE("cross-host spans cover the buffer once, for even and uneven hosts", "[topology]") {
  const std::vector<std::vector<int>> layouts{{1}, {2, 2}, {2, 1}, {1, 2}, {1, 1, 1}, {3, 2}, {4, 3, 2}, {8, 8}};
  for (const auto& sizes : layouts) {
    for (size_t count : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(7), size_t(16), size_t(1001)}) {
      checkSpans(count, sizes);
    }
  }
}

TEST_CASE("2 hosts x 2 ranks: each rank all-reduces half of the buffer across hosts", "[topology]") {
  auto spans = topology::crossHostSpans(16, {2, 2});
  REQUIRE(spans.size() == 2);
  REQUIRE((spans[0].begin == 0 && spans[0].end == 8 && spans[0].owners == std::vector<int>{0, 0}));
  REQUIRE((spans[1].begin == 8 && spans[1].end == 16 && spans[1].owners == std::vector<int>{1, 1}));
}

TEST_CASE("uneven hosts 2+1: the single rank pairs with each rank of the other host", "[topology]") {
  auto spans = topology::crossHostSpans(11, {2, 1});
  // Host 0: blocks [0,5) and [5,10), tail [10,11) on position 0. Host 1: everything on position 0.
  REQUIRE(spans.size() == 3);
  REQUIRE((spans[0].end == 5 && spans[0].owners == std::vector<int>{0, 0}));
  REQUIRE((spans[1].end == 10 && spans[1].owners == std::vector<int>{1, 0}));
  REQUIRE((spans[2].end == 11 && spans[2].owners == std::vector<int>{0, 0}));
}

TEST_CASE("uneven hosts 3+2: owners follow both slicings", "[topology]") {
  auto spans = topology::crossHostSpans(12, {3, 2});
  // Host 0 blocks of 4, host 1 blocks of 6: cuts at 4, 6, 8.
  REQUIRE(spans.size() == 4);
  REQUIRE(spans[0].owners == std::vector<int>{0, 0});
  REQUIRE(spans[1].owners == std::vector<int>{1, 0});
  REQUIRE(spans[2].owners == std::vector<int>{1, 1});
  REQUIRE(spans[3].owners == std::vector<int>{2, 1});
}

// A rendezvous through which the probe's name is replaced by one that does not exist, as if the readers were on
// another machine than the probe's creator.
class BlindRendezvous final : public core::Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override { inner_.set(key, value); }
  bool check(const std::string& key) override { return inner_.check(key); }
  std::string get(const std::string& key, Ms timeout) override {
    std::string v = inner_.get(key, timeout);
    if (key.rfind("tunedist_host_probe/", 0) == 0) {
      return "/" + shm::ShmSegment::userPrefix() + "probe_does_not_exist\n" + v.substr(v.find('\n') + 1);
    }
    return v;
  }

 private:
  MemRendezvous inner_;
};

std::vector<std::exception_ptr> discover(const std::shared_ptr<core::Rendezvous>& rdv,
                                         const std::vector<std::string>& labels, std::vector<HostLayout>& out) {
  const int size = int(labels.size());
  out.assign(size_t(size), HostLayout{});
  const std::string fp = topology::shareableMemoryFingerprint("/dev/shm");
  return spawn(size, [&](int r) {
    topology::HostDiscovery d(rdv, r, size, core::ShmOptions{});
    d.publish(HostKey{labels[size_t(r)], fp});
    auto deadline = Clock::now() + kOpTimeout;
    out[size_t(r)] = d.proposeLayout(deadline);
    d.verify(out[size_t(r)], deadline);
  });
}

TEST_CASE("HostDiscovery finds and verifies hosts of several ranks", "[topology]") {
  ShmLeakCheck leaks;
  std::vector<HostLayout> layouts;
  // Host "a" has four ranks: three readers open the one probe, so no reader may take its name away.
  rethrowFailures(discover(std::make_shared<MemRendezvous>(), {"a", "a", "b", "a", "b", "a"}, layouts));
  for (const auto& l : layouts) {
    REQUIRE(l.hosts == std::vector<std::vector<int>>{{0, 1, 3, 5}, {2, 4}});
  }
  REQUIRE(leaks.report().empty());
}

TEST_CASE("HostDiscovery fails on every rank when a proposed host cannot share memory", "[topology]") {
  ShmLeakCheck leaks;
  std::vector<HostLayout> layouts;
  auto errors = discover(std::make_shared<BlindRendezvous>(), {"", "", ""}, layouts);
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] != nullptr);
    REQUIRE_THAT(messageOf(errors[r]), Catch::Contains("cannot share memory") && Catch::Contains("ranks [0,1,2]"));
  }
  REQUIRE(leaks.report().empty());
}

}  // namespace
}  // namespace tunedist::test
