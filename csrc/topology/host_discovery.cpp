#include "topology/host_discovery.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/store_keys.h"
#include "shm/segment.h"

namespace tunedist::topology {
namespace {

using core::keys::kHostKeyPrefix;
using core::keys::kHostProbePrefix;
using core::keys::kHostVerdictPrefix;
constexpr const char* kVerdictOk = "ok";
constexpr size_t kProbeBytes = 4096;
constexpr size_t kTokenBytes = 16;
constexpr auto kStaleProbeGrace = std::chrono::seconds(10);

// "<label length>:<label><fingerprint>": labels may hold any character.
std::string encodeKey(const HostKey& key) {
  return std::to_string(key.label.size()) + ":" + key.label + key.fingerprint;
}

HostKey decodeKey(const std::string& text, int rank) {
  size_t colon = text.find(':');
  TD_CHECK(colon != std::string::npos, "tunedist: malformed host key of rank ", rank, ": '", text, "'");
  size_t len = std::stoul(text.substr(0, colon));
  TD_CHECK(colon + 1 + len <= text.size(), "tunedist: malformed host key of rank ", rank);
  return HostKey{text.substr(colon + 1, len), text.substr(colon + 1 + len)};
}

// Opens the probe named in `text` ("<name>\n<token>") and checks its token: "" on success, else what is wrong.
std::string openProbe(const std::string& text, int creator) {
  size_t nl = text.find('\n');
  if (nl == std::string::npos) {
    return core::detail::str("malformed host probe key of rank ", creator);
  }
  const std::string name = text.substr(0, nl);
  const std::string token = text.substr(nl + 1);
  try {
    bool notFound = false;
    shm::ShmSegment probe = shm::ShmSegment::open(name, kProbeBytes, &notFound);
    probe.keepName();  // the host's other ranks may still have to open it; its creator unlinks it
    if (notFound) {
      return core::detail::str("cannot open the probe '", name, "' of rank ", creator, " (not found)");
    }
    if (std::string(static_cast<const char*>(probe.data()), token.size()) != token) {
      return core::detail::str("opened a probe named '", name, "' but its token differs from rank ", creator, "'s");
    }
  } catch (const std::exception& e) {
    return core::detail::str("cannot open the probe of rank ", creator, ": ", e.what());
  }
  return "";
}

}  // namespace

HostDiscovery::HostDiscovery(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size,
                             const core::ShmOptions& options)
    : rendezvous_(std::move(rendezvous)),
      rank_(rank),
      size_(size),
      shmDir_(options.shmDir),
      sweepMinAge_(options.sweepMinAge) {}

void HostDiscovery::publish(const HostKey& key) {
  rendezvous_->set(kHostKeyPrefix + std::to_string(rank_), encodeKey(key));
}

std::string HostDiscovery::getBefore(const std::string& key, Clock::time_point deadline, const char* what) {
  auto pause = std::chrono::microseconds(200);
  while (!rendezvous_->check(key) && Clock::now() < deadline) {
    // A rank that failed its first operation before finding its host (a caller error, say) never writes its
    // keys; it leaves its reason where the engines do (ShmComm before attaching, CrossHost), so stop on it.
    for (const char* abortKey : core::keys::kPeerAbortKeys) {
      if (rendezvous_->check(abortKey)) {
        throw core::Error(core::detail::str("tunedist: rank ", rank_, " of ", size_,
                                            ": a peer failed while the group was ", "finding its hosts: ",
                                            rendezvous_->get(abortKey, std::chrono::milliseconds(1000))));
      }
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    return rendezvous_->get(key, std::max(left, std::chrono::milliseconds(1)));
  } catch (const core::TimeoutError&) {
    throw core::TimeoutError(core::detail::str("tunedist: rank ", rank_, " of ", size_, ": Timed out waiting for ",
                                               what, " (store key '", key,
                                               "') while finding which ranks share a host; check that "
                                               "it is alive and calls this operation too"));
  }
}

HostLayout HostDiscovery::proposeLayout(Clock::time_point deadline) {
  std::vector<HostKey> keys;
  for (int r = 0; r < size_; ++r) {
    keys.push_back(decodeKey(getBefore(kHostKeyPrefix + std::to_string(r), deadline,
                                       core::detail::str("rank ", r, " to publish its host key").c_str()),
                             r));
  }
  return groupRanksByHost(keys);
}

std::string HostDiscovery::checkProbe(const HostLayout& layout, int host, Clock::time_point deadline) {
  const int creator = layout.rankAt(host, 0);
  const std::string key = kHostProbePrefix + std::to_string(creator);
  // The store may still hold the probe of an earlier incarnation of this group (torchrun restarts keep the
  // store): a probe that is gone or has another token is retried until the key changes, for a grace period.
  const auto graceEnd = std::min(deadline, Clock::now() + kStaleProbeGrace);
  std::string problem;
  for (;;) {
    std::string text = getBefore(key, deadline,
                                 core::detail::str("rank ", creator, " to create the host probe").c_str());
    problem = openProbe(text, creator);
    if (problem.empty() || Clock::now() >= graceEnd) {
      return problem;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void HostDiscovery::verify(const HostLayout& layout, Clock::time_point deadline) {
  const int host = layout.hostOf[size_t(rank_)];
  const bool shared = layout.hosts[size_t(host)].size() > 1;
  shm::ShmSegment probe;  // the creator holds it until every verdict is in; unlinked on scope exit
  // Verdicts are "<this host's probe token>:<ok or the problem>", so a host's ranks tell this incarnation's
  // verdicts from an earlier one's left in the store.
  std::string token;
  std::string outcome = kVerdictOk;
  if (shared && layout.localRankOf[size_t(rank_)] == 0) {
    probe = shm::ShmSegment::create("probe", kProbeBytes, shmDir_, sweepMinAge_);
    token = shm::randomHex(kTokenBytes);
    std::memcpy(probe.data(), token.data(), token.size());
    rendezvous_->set(kHostProbePrefix + std::to_string(rank_), probe.name() + "\n" + token);
  } else if (shared) {
    std::string problem = checkProbe(layout, host, deadline);
    std::string text = rendezvous_->get(kHostProbePrefix + std::to_string(layout.rankAt(host, 0)),
                                        std::chrono::milliseconds(1000));
    token = text.substr(text.find('\n') + 1);
    if (!problem.empty()) {
      outcome = core::detail::str("rank ", rank_, " ", problem);
    }
  }
  rendezvous_->set(kHostVerdictPrefix + std::to_string(rank_), token + ":" + outcome);
  for (int r = 0; r < size_; ++r) {
    const bool mine = layout.hostOf[size_t(r)] == host && shared;
    std::string v;
    for (;;) {
      v = getBefore(kHostVerdictPrefix + std::to_string(r), deadline,
                    core::detail::str("rank ", r, " to check its host").c_str());
      if (!mine || v.rfind(token + ":", 0) == 0 || Clock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // an earlier incarnation's verdict
    }
    v = v.substr(v.find(':') + 1);
    const auto& members = layout.hosts[size_t(layout.hostOf[size_t(r)])];
    TD_CHECK(v == kVerdictOk, "tunedist: ranks ", ranksText(members),
             " look like one host (same machine, same /dev/shm, same TUNEDIST_HOST_ID) but cannot share memory: ", v,
             ". Give them different TUNEDIST_HOST_IDs, or run them in one IPC namespace (containers: --ipc=host)");
  }
}

}  // namespace tunedist::topology
