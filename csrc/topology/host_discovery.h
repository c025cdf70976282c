// HostDiscovery: finds, through the group's rendezvous, which ranks share a host, and verifies it.
//
// Protocol (keys are per group: the backend's rendezvous sits on the group's PrefixStore):
//   1. publish() (at group creation, never blocks): rank r writes its HostKey to core::keys::kHostKeyPrefix + r.
//   2. proposeLayout() (lazily, at the group's first operation): reads every rank's key and groups them
//      (groupRanksByHost). Touches no shared memory, so point-to-point calls can use it without the whole group.
//   3. verify() (at the group's first collective, on every rank): the first rank of each proposed host creates a
//      probe segment (ShmSegment: O_EXCL, mode 0600, random name) holding a random token and publishes name and
//      token; the host's other ranks open it and compare the token; every rank writes its verdict, then reads
//      every rank's verdict, so a host that is not one (ranks that cannot open the same memory) is the same clear
//      error on every rank. The probe's creator keeps it until it has read every verdict, then it is unlinked.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/options.h"
#include "core/rendezvous.h"
#include "topology/host_topology.h"

namespace tunedist::topology {

class HostDiscovery {
 public:
  using Clock = std::chrono::steady_clock;

  HostDiscovery(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, const core::ShmOptions& options);

  void publish(const HostKey& key);
  HostLayout proposeLayout(Clock::time_point deadline);
  void verify(const HostLayout& layout, Clock::time_point deadline);

 private:
  std::string getBefore(const std::string& key, Clock::time_point deadline, const char* what);
  // Opens host `host`'s probe and checks its token; returns "" on success, else what went wrong.
  std::string checkProbe(const HostLayout& layout, int host, Clock::time_point deadline);

  std::shared_ptr<core::Rendezvous> rendezvous_;
  const int rank_;
  const int size_;
  const char* shmDir_;
  const std::chrono::seconds sweepMinAge_;
};

}  // namespace tunedist::topology
