#include "shm/host_discovery.h"

#include <cstring>
#include <utility>

#include "shm/error.h"
#include "shm/segment.h"

namespace tunedist::shm {
namespace {

constexpr const char* kKeyPrefix = "tunedist_host/";
constexpr const char* kProbePrefix = "tunedist_host_probe/";
constexpr const char* kVerdictPrefix = "tunedist_host_verdict/";
constexpr const char* kVerdictOk = "ok";
constexpr size_t kProbeBytes = 4096;
constexpr size_t kTokenBytes = 16;

// "<label length>:<label><fingerprint>": labels may hold any character.
std::string encodeKey(const HostKey& key) { return std::to_string(key.label.size()) + ":" + key.label + key.fingerprint; }

HostKey decodeKey(const std::string& text, int rank) {
  size_t colon = text.find(':');
  TD_CHECK(colon != std::string::npos, "tunedist: malformed host key of rank ", rank, ": '", text, "'");
  size_t len = std::stoul(text.substr(0, colon));
  TD_CHECK(colon + 1 + len <= text.size(), "tunedist: malformed host key of rank ", rank);
  return HostKey{text.substr(colon + 1, len), text.substr(colon + 1 + len)};
}

}  // namespace

HostDiscovery::HostDiscovery(std::shared_ptr<Rendezvous> rendezvous, int rank, int size, const char* shmDir)
    : rendezvous_(std::move(rendezvous)), rank_(rank), size_(size), shmDir_(shmDir) {}

void HostDiscovery::publish(const HostKey& key) { rendezvous_->set(kKeyPrefix + std::to_string(rank_), encodeKey(key)); }

std::string HostDiscovery::getBefore(const std::string& key, Clock::time_point deadline, const char* what) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    return rendezvous_->get(key, std::max(left, std::chrono::milliseconds(1)));
  } catch (const TimeoutError&) {
    throw TimeoutError(detail::str("tunedist: rank ", rank_, " of ", size_, " timed out waiting for ", what,
                                   " (store key '", key, "') while finding which ranks share a host; check that "
                                   "it is alive and calls this operation too"));
  }
}

HostLayout HostDiscovery::proposeLayout(Clock::time_point deadline) {
  std::vector<HostKey> keys;
  for (int r = 0; r < size_; ++r) {
    keys.push_back(decodeKey(getBefore(kKeyPrefix + std::to_string(r), deadline,
                                       detail::str("rank ", r, " to publish its host key").c_str()),
                             r));
  }
  return groupRanksByHost(keys);
}

std::string HostDiscovery::checkProbe(const HostLayout& layout, int host, Clock::time_point deadline) {
  const int creator = layout.rankAt(host, 0);
  std::string text = getBefore(kProbePrefix + std::to_string(creator), deadline,
                               detail::str("rank ", creator, " to create the host probe").c_str());
  size_t nl = text.find('\n');
  TD_CHECK(nl != std::string::npos, "tunedist: malformed host probe key of rank ", creator);
  const std::string name = text.substr(0, nl);
  const std::string token = text.substr(nl + 1);
  try {
    bool notFound = false;
    ShmSegment probe = ShmSegment::open(name, kProbeBytes, &notFound);
    probe.keepName();  // the host's other ranks may still have to open it; its creator unlinks it
    if (notFound) {
      return detail::str("rank ", rank_, " cannot open the probe '", name, "' of rank ", creator, " (not found)");
    }
    std::string seen(static_cast<const char*>(probe.data()), token.size());
    if (seen != token) {
      return detail::str("rank ", rank_, " opened a probe named '", name, "' but its token differs from rank ",
                         creator, "'s");
    }
  } catch (const std::exception& e) {
    return detail::str("rank ", rank_, " cannot open the probe of rank ", creator, ": ", e.what());
  }
  return "";
}

void HostDiscovery::verify(const HostLayout& layout, Clock::time_point deadline) {
  const int host = layout.hostOf[size_t(rank_)];
  ShmSegment probe;  // the creator holds it until every verdict is in; unlinked on scope exit
  std::string verdict = kVerdictOk;
  if (layout.hosts[size_t(host)].size() > 1) {
    if (layout.localRankOf[size_t(rank_)] == 0) {
      probe = ShmSegment::create("probe", kProbeBytes, shmDir_);
      const std::string token = randomHex(kTokenBytes);
      std::memcpy(probe.data(), token.data(), token.size());
      rendezvous_->set(kProbePrefix + std::to_string(rank_), probe.name() + "\n" + token);
    } else {
      std::string problem = checkProbe(layout, host, deadline);
      if (!problem.empty()) {
        verdict = problem;
      }
    }
  }
  rendezvous_->set(kVerdictPrefix + std::to_string(rank_), verdict);
  for (int r = 0; r < size_; ++r) {
    std::string v = getBefore(kVerdictPrefix + std::to_string(r), deadline,
                              detail::str("rank ", r, " to check its host").c_str());
    const auto& members = layout.hosts[size_t(layout.hostOf[size_t(r)])];
    TD_CHECK(v == kVerdictOk, "tunedist: ranks ", ranksText(members),
             " look like one host (same machine, same /dev/shm, same TUNEDIST_HOST_ID) but cannot share memory: ",
             v, ". Give them different TUNEDIST_HOST_IDs, or run them in one IPC namespace (containers: --ipc=host)");
  }
}

}  // namespace tunedist::shm
