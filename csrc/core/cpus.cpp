#include "core/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace tunedist::core {
namespace {

int affinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return CPU_COUNT(&set);
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? int(online) : 0;
}

// cgroup v2: "max 100000" (no quota) or "200000 100000"; v1: two files. false where neither says anything.
bool cgroupQuota(long long* quotaUs, long long* periodUs) {
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  std::string quota;
  if (v2 >> quota >> *periodUs) {
    if (quota == "max") {
      return false;
    }
    try {
      *quotaUs = std::stoll(quota);
    } catch (...) {
      return false;
    }
    return true;
  }
  std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  std::ifstream p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  return bool(q >> *quotaUs) && bool(p >> *periodUs);
}

}  // namespace

int usableCpusFrom(int affinity, long long quotaUs, long long periodUs) {
  int cpus = std::max(affinity, 1);
  if (quotaUs > 0 && periodUs > 0) {
    const long long quotaCpus = (quotaUs + periodUs - 1) / periodUs;
    cpus = int(std::min<long long>(cpus, std::max<long long>(quotaCpus, 1)));
  }
  return cpus;
}

int usableCpus() {
  static const int cpus = [] {
    long long quotaUs = 0;
    long long periodUs = 0;
    if (!cgroupQuota(&quotaUs, &periodUs)) {
      quotaUs = periodUs = 0;
    }
    return usableCpusFrom(affinityCpus(), quotaUs, periodUs);
  }();
  return cpus;
}

}  // namespace tunedist::core
