#include "topology/host_topology.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace tunedist::topology {

std::string shareableMemoryFingerprint(const char* shmDir) {
  std::string bootId;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, bootId);
  struct stat st {};
  TD_CHECK(::stat(shmDir, &st) == 0, "tunedist: cannot stat the shared-memory directory ", shmDir, ": ",
           std::strerror(errno));
  return core::detail::str(bootId.empty() ? "no-boot-id" : bootId, ":", uint64_t(st.st_dev), ":", uint64_t(st.st_ino));
}

std::string hostLabelFromEnv() { return core::envString("TUNEDIST_HOST_ID").value_or(std::string()); }

std::string ranksText(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    s += (s.empty() ? "" : ",") + std::to_string(r);
  }
  return "[" + s + "]";
}

std::vector<int> HostLayout::hostSizes() const {
  std::vector<int> sizes;
  for (const auto& h : hosts) {
    sizes.push_back(int(h.size()));
  }
  return sizes;
}

HostLayout groupRanksByHost(const std::vector<HostKey>& keys) {
  const int size = int(keys.size());
  // One label on two fingerprints would merge ranks that cannot share memory.
  std::map<std::string, int> firstWithLabel;
  for (int r = 0; r < size; ++r) {
    if (keys[size_t(r)].label.empty()) {
      continue;
    }
    auto [it, fresh] = firstWithLabel.emplace(keys[size_t(r)].label, r);
    TD_CHECK(fresh || keys[size_t(it->second)].fingerprint == keys[size_t(r)].fingerprint,
             "tunedist: TUNEDIST_HOST_ID='", keys[size_t(r)].label, "' is set on rank ", it->second, " and rank ", r,
             ", but they cannot share memory (different machines or /dev/shm mounts: ",
             keys[size_t(it->second)].fingerprint, " vs ", keys[size_t(r)].fingerprint,
             "). TUNEDIST_HOST_ID can only split ranks that share memory into separate hosts; give each machine "
             "its own TUNEDIST_HOST_ID, or leave it unset");
  }
  HostLayout layout;
  layout.hostOf.assign(size_t(size), -1);
  layout.localRankOf.assign(size_t(size), -1);
  std::map<std::pair<std::string, std::string>, int> hostIndex;
  for (int r = 0; r < size; ++r) {
    auto key = std::make_pair(keys[size_t(r)].fingerprint, keys[size_t(r)].label);
    auto [it, fresh] = hostIndex.emplace(key, layout.numHosts());
    if (fresh) {
      layout.hosts.emplace_back();
    }
    auto& members = layout.hosts[size_t(it->second)];
    layout.hostOf[size_t(r)] = it->second;
    layout.localRankOf[size_t(r)] = int(members.size());
    members.push_back(r);
  }
  return layout;
}

std::vector<CrossHostSpan> crossHostSpans(size_t count, const std::vector<int>& hostSizes) {
  TD_ASSERT(!hostSizes.empty());
  std::vector<HostSlicing> slicings;
  std::vector<size_t> cuts{0, count};
  for (int localSize : hostSizes) {
    TD_ASSERT(localSize >= 1);
    slicings.push_back(HostSlicing::of(count, localSize));
    for (int j = 1; j <= localSize; ++j) {
      cuts.push_back(slicings.back().block * size_t(j));
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<CrossHostSpan> spans;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const size_t begin = cuts[i];
    const size_t end = cuts[i + 1];
    if (begin == end) {
      continue;
    }
    std::vector<int> owners;
    for (const auto& s : slicings) {
      owners.push_back(s.ownerOf(begin));
    }
    if (!spans.empty() && spans.back().end == begin && spans.back().owners == owners) {
      spans.back().end = end;
    } else {
      spans.push_back(CrossHostSpan{begin, end, std::move(owners)});
    }
  }
  return spans;
}

}  // namespace tunedist::topology
