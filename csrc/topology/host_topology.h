// Which ranks of a process group share a host, and how the hierarchical all-reduce slices a buffer across hosts.
// Torch-free, so the engine's tests cover it (tests/cpp/test_shm_host_topology.cpp).
//
// A "host" is a set of ranks that can open the same POSIX shared memory. Each rank describes itself with a
// HostKey: its TUNEDIST_HOST_ID label (may be empty) and a fingerprint of the memory it can share (the kernel's
// boot id and the device and inode of the shared-memory directory). Ranks whose fingerprints differ cannot share
// memory, whatever their labels say; ranks with equal fingerprints are one host unless their labels split them.
// The fingerprint only proposes the grouping: HostDiscovery then verifies every proposed host with a probe segment.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tunedist::topology {

struct HostKey {
  std::string label;        // TUNEDIST_HOST_ID, or "" when unset
  std::string fingerprint;  // shareableMemoryFingerprint() of the rank's shared-memory directory
};

// "<boot id>:<st_dev>:<st_ino>" of `shmDir`: equal for processes that can open the same POSIX shared memory.
std::string shareableMemoryFingerprint(const char* shmDir);
// TUNEDIST_HOST_ID, or "" when unset.
std::string hostLabelFromEnv();

struct HostLayout {
  std::vector<std::vector<int>> hosts;  // group ranks of each host, ascending; hosts ordered by their lowest rank
  std::vector<int> hostOf;              // rank -> host index
  std::vector<int> localRankOf;         // rank -> position within its host

  int numHosts() const { return int(hosts.size()); }
  bool oneHost() const { return hosts.size() == 1; }
  std::vector<int> hostSizes() const;
  // The rank at position `local` of host `host`.
  int rankAt(int host, int local) const { return hosts[size_t(host)][size_t(local)]; }
};

// "[0,1,2]": a list of ranks for messages.
std::string ranksText(const std::vector<int>& ranks);

// Groups ranks by (fingerprint, label). Throws tunedist::core::Error naming the ranks when one label covers ranks with
// different fingerprints: TUNEDIST_HOST_ID may split a host, never merge ranks that cannot share memory.
HostLayout groupRanksByHost(const std::vector<HostKey>& keys);

// One piece of the buffer in the hierarchical all-reduce: elements [begin, end), all-reduced across hosts among
// the ranks owners[h] (a position within host h) of every host h.
struct CrossHostSpan {
  size_t begin = 0;
  size_t end = 0;
  std::vector<int> owners;
};

// How host h (L ranks) splits `count` elements: position j reduces block j = [j*block, (j+1)*block), and the
// tail [L*block, count) (fewer than L elements) is reduced by every rank of the host and owned by position 0.
struct HostSlicing {
  size_t block = 0;
  size_t tailBegin = 0;
  static HostSlicing of(size_t count, int localSize) {
    HostSlicing s;
    s.block = count / size_t(localSize);
    s.tailBegin = s.block * size_t(localSize);
    return s;
  }
  int ownerOf(size_t element) const { return element < tailBegin ? int(element / block) : 0; }
};

// The cross-host spans of a `count`-element all-reduce over hosts of the given sizes: the common refinement of
// every host's HostSlicing, adjacent pieces with the same owners merged, empty pieces dropped. Every element is in
// exactly one span, and in each span every host has exactly one owner, which holds that host's partial result.
std::vector<CrossHostSpan> crossHostSpans(size_t count, const std::vector<int>& hostSizes);

}  // namespace tunedist::topology
