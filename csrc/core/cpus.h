// How many CPUs this process can keep busy at once: the CPUs its affinity mask allows, capped by a cgroup CPU quota
// (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up. A container given 2 CPUs of a
// 64-CPU host reports 2, where the affinity mask alone says 64.
#pragma once

namespace tunedist::core {

// At least 1. Read once per process (the first call) and kept: a group's ranks decide from it at construction.
int usableCpus();

// The same from explicit inputs, for tests: `affinityCpus` (CPU_COUNT of the mask, 0 if unknown), a quota in
// microseconds per `periodUs` (quotaUs <= 0 or periodUs <= 0: no quota).
int usableCpusFrom(int affinityCpus, long long quotaUs, long long periodUs);

}  // namespace tunedist::core
