// Every key tunedist writes to a group's store (c10d::Store through Rendezvous, or the store itself), in one place.
// The group's store is already a PrefixStore of that group, so these keys never collide across groups; a group
// that spans several hosts gives each host's engines its own prefix (hostPrefix).
#pragma once

#include <string>

namespace tunedist::core::keys {

// Host discovery (topology/host_discovery.cpp): rank r's HostKey, the per-host probe segment names, and the
// leaders' verdicts on them; each prefix is followed by a rank or host index.
inline constexpr const char* kHostKeyPrefix = "tunedist_host/";
inline constexpr const char* kHostProbePrefix = "tunedist_host_probe/";
inline constexpr const char* kHostVerdictPrefix = "tunedist_host_verdict/";

// The prefix of host `host`'s own keys (its ShmComm and P2pEngine) in a group that spans several hosts.
inline std::string hostPrefix(int host) { return "tunedist_hosts/" + std::to_string(host) + "/"; }

// ShmComm (shm/comm.cpp): the name of the group's segment, and the reason of a rank that failed before the segment
// existed (so peers still attaching fail with it instead of waiting for the timeout).
inline constexpr const char* kShmSegment = "tunedist_shm_segment";
inline constexpr const char* kShmAbort = "tunedist_shm_abort";

// CrossHost (backend/engine/hier): the first failure of a group that spans hosts, polled by ranks waiting on gloo,
// and the prefix of the gloo groups' own stores.
inline constexpr const char* kCrossAbort = "tunedist_cross_abort";
inline constexpr const char* kGlooPrefix = "tunedist_gloo/";

// Where a failed peer may leave its reason before the engines exist: ShmComm's key, and CrossHost's.
inline constexpr const char* kPeerAbortKeys[] = {kShmAbort, kCrossAbort};

// P2pEngine (shm/p2p): the sender of the ring src -> dst announces the ring's segment name here.
inline std::string p2pRing(int src, int dst) {
  return "tunedist_p2p_" + std::to_string(src) + "_" + std::to_string(dst);
}

// P2pEngine (shm/p2p/peers.h): rank's process identity (pid, pid namespace, start time), written when its engine is
// made, so a peer that dies before it has a ring with this rank is found dead.
inline std::string p2pIdentity(int rank) { return "tunedist_p2p_identity_" + std::to_string(rank); }

}  // namespace tunedist::core::keys
