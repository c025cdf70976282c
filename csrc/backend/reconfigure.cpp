// TunedBackend::reconfigure and get_reconfigure_handle: the group re-formed on a new set of processes, as torch 2.15
// defines reconfigure for gloo (Backend::supportsReconfigure; dist.distributed_c10d._get_reconfigure_handle and
// _reconfigure(uuid, handles, group)). The typical use: the survivors of a dead rank re-form the group without it,
// and later a replacement process, started with init_process_group(..., enable_reconfigure=True), joins them and
// the group is back to full size.
//
// Protocol (every member calls reconfigure with the same handles and the same uuid):
//   1. Handles, exchanged out of band: "tuned:<rank>:<uuid>:<stable rank>:<instance>:<store address>" (the
//      current rank and membership uuid, -1 before the first reconfigure; the rank the process joined with first;
//      a random 64-bit instance id, so two processes never have the same handle; the TCPStore's host:port, for
//      the reader). A list gives the new ranks by position; a set is ordered by stable rank, so survivors keep
//      their order and a replacement started with a dead rank's rank takes its place.
//   2. The uuid names the new membership's store prefix, tuned_reconfigure/<uuid>/, under the group's store. A
//      reused uuid would meet an earlier membership's keys: new rank 0 claims the uuid (compareSet writes its
//      handle only where no claim exists) and every other member waits for the claim and checks that it is its
//      rank 0's handle, so a reused uuid fails on every member. A process also refuses a uuid it tried before.
//   3. A new CPU side is made over that prefix (new rank, new size) and waits until every member has published its
//      host key (the layout of hosts, as a new group's first operation does), or the timeout: a member that does
//      not come is named, and the group stays as it was.
//   4. Then the group switches: rank and size are the new ones, the old CPU side is aborted and released (whatever
//      it still had in flight fails; its shared-memory segments, rings, heap chunk names and gloo groups between
//      hosts go with it), and the new one builds its engines at its first operation as a new group does. The NCCL
//      side is made for the new members at their first CUDA call. Once it exists, each member's handle is
//      "tuned2:<bytes>:<CPU handle><NCCL handle>" and the NCCL side is reconfigured from its parts too (nccl2 can;
//      the classic ProcessGroupNCCL cannot, and such a group refuses before anything changes).
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>
#include <string>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "backend/cpu/store_rendezvous.h"
#include "backend/tuned_backend.h"
#include "core/store_keys.h"

namespace tunedist {

#ifdef C10D_BACKEND_HAS_RECONFIGURE
namespace {

constexpr const char* kHandleTag = "tuned";
constexpr const char* kClaimKey = "claimed";

struct Member {
  int rank;            // its rank in its current membership
  int64_t uuid;        // the uuid of its current membership; -1 before its first reconfigure
  int64_t stableRank;  // the rank it joined with first
  uint64_t instance;
  std::string storeAddress;
  std::string handle;
};

std::string formatHandle(int rank, int64_t uuid, int64_t stableRank, uint64_t instance, const std::string& address) {
  char id[17];
  std::snprintf(id, sizeof(id), "%016" PRIx64, instance);
  return c10::str(kHandleTag, ":", rank, ":", uuid, ":", stableRank, ":", id, ":", address);
}

Member parseHandle(const std::string& handle, int rank) {
  // Five fields, then the store address, which has colons of its own.
  std::vector<std::string> fields;
  size_t start = 0;
  for (int i = 0; i < 5; ++i) {
    const size_t colon = handle.find(':', start);
    if (colon == std::string::npos) {
      break;
    }
    fields.push_back(handle.substr(start, colon - start));
    start = colon + 1;
  }
  const std::string bad = c10::str("tunedist: reconfigure on rank ", rank, ": '", handle,
                                   "' is not a `tuned` reconfigure handle (tuned:<rank>:<uuid>:<stable rank>:"
                                   "<instance>:<store address>, as get_reconfigure_handle returns it)");
  TORCH_CHECK(fields.size() == 5 && fields[0] == kHandleTag && fields[4].size() == 16, bad);
  try {
    size_t used = 0;
    Member m{};
    m.rank = std::stoi(fields[1], &used);
    TORCH_CHECK(used == fields[1].size(), bad);
    m.uuid = std::stoll(fields[2], &used);
    TORCH_CHECK(used == fields[2].size(), bad);
    m.stableRank = std::stoll(fields[3], &used);
    TORCH_CHECK(used == fields[3].size() && m.stableRank >= 0, bad);
    m.instance = std::stoull(fields[4], &used, 16);
    TORCH_CHECK(used == fields[4].size(), bad);
    m.storeAddress = handle.substr(start);
    m.handle = handle;
    return m;
  } catch (const std::logic_error&) {  // std::stoi and friends: no number, or out of range
    TORCH_CHECK(false, bad);
  }
}

// The order of a set of members: by stable rank, then by handle (two processes that joined with the same rank).
bool bySetOrder(const Member& a, const Member& b) {
  return a.stableRank != b.stableRank ? a.stableRank < b.stableRank : a.handle < b.handle;
}

// The members in their new rank order: a list by position, a set by stable rank (bySetOrder).
std::vector<Member> orderedMembers(const c10d::ReconfigureOptions& opts, int rank) {
  std::vector<Member> members;
  std::visit(
      [&](const auto& handles) {
        for (const auto& h : handles) {
          members.push_back(parseHandle(h, rank));
        }
      },
      opts.handles);
  TORCH_CHECK(!members.empty(), "tunedist: reconfigure on rank ", rank, ": no handles; pass every member's handle");
  if (std::holds_alternative<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles)) {
    std::sort(members.begin(), members.end(), bySetOrder);
  }
  std::unordered_set<uint64_t> instances;
  for (const Member& m : members) {
    // A process's handle changes with each reconfigure: two handles of one process are an old and a new one.
    TORCH_CHECK(instances.insert(m.instance).second, "tunedist: reconfigure on rank ", rank,
                ": two handles name the same process (", m.handle,
                " and another); pass each member's current handle once");
  }
  return members;
}

// host:port of the TCPStore under `store`'s prefixes; empty for other stores.
std::string storeAddress(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(base.get())) {
    base = prefixed->getUnderlyingNonPrefixStore();
  }
  auto* tcp = dynamic_cast<c10d::TCPStore*>(base.get());
  return tcp ? c10::str(tcp->getHost(), ":", tcp->getPort()) : std::string();
}

std::string asString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Step 2: the uuid is this membership's, or every member refuses it.
void claimUuid(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<Member>& members, int newRank,
               int64_t uuid, int rank, std::chrono::milliseconds timeout) {
  const std::string& first = members.front().handle;
  std::string claimedBy;
  if (newRank == 0) {
    claimedBy = asString(store->compareSet(kClaimKey, {}, std::vector<uint8_t>(first.begin(), first.end())));
  } else {
    cpu::StoreRendezvous rendezvous(store);
    try {
      claimedBy = rendezvous.get(kClaimKey, timeout);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "tunedist: reconfigure on rank ", rank, ": new rank 0 (", first, ") did not claim uuid ", uuid,
                  " within ", timeout.count(), " ms: ", e.what());
    }
  }
  TORCH_CHECK(claimedBy == first, "tunedist: reconfigure on rank ", rank, ": uuid ", uuid,
              " was used already (claimed by ", claimedBy, "); every reconfigure needs a fresh uuid");
}

// A group with an NCCL side hands out one handle for both sides: "tuned2:<bytes of the CPU handle>:<CPU handle>"
// followed by the NCCL side's handle. Each side is re-formed from its own part of every member's handle.
constexpr char kBothSides[] = "tuned2:";

c10d::ReconfigureHandle joinHandles(const std::string& cpu, const std::string& cuda) {
  return kBothSides + std::to_string(cpu.size()) + ":" + cpu + cuda;
}

// Splits one member's handle into its CPU and CUDA parts; a handle without both parts is refused by name.
std::pair<std::string, std::string> splitHandle(const std::string& handle, int rank) {
  const size_t head = sizeof(kBothSides) - 1;
  const size_t colon = handle.compare(0, head, kBothSides) == 0 ? handle.find(':', head) : std::string::npos;
  size_t cpuBytes = 0;
  bool ok = colon != std::string::npos;
  if (ok) {
    try {
      cpuBytes = std::stoul(handle.substr(head, colon - head));
    } catch (const std::logic_error&) {
      ok = false;
    }
  }
  TORCH_CHECK(ok && colon + 1 + cpuBytes <= handle.size(), "tunedist: reconfigure on rank ", rank, ": handle '", handle,
              "' has no CUDA part, and this group's NCCL side exists; every member's group must have its CUDA side "
              "when the handles are taken (bind each group to its CUDA device: init_process_group(device_id=...))");
  return {handle.substr(colon + 1, cpuBytes), handle.substr(colon + 1 + cpuBytes)};
}

// One Work for both sides' reconfigure: done when both are.
class BothSidesWork : public c10d::Work {
 public:
  BothSidesWork(int rank, c10::intrusive_ptr<c10d::Work> cpu, c10::intrusive_ptr<c10d::Work> cuda)
      : c10d::Work(rank, c10d::OpType::UNKNOWN, "tuned:reconfigure"), cpu_(std::move(cpu)), cuda_(std::move(cuda)) {}
  bool isCompleted() override { return cpu_->isCompleted() && cuda_->isCompleted(); }
  bool isSuccess() const override { return cpu_->isSuccess() && cuda_->isSuccess(); }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool cpuDone = cpu_->wait(timeout);
    return cuda_->wait(timeout) && cpuDone;
  }
  void abort() override {
    cpu_->abort();
    cuda_->abort();
  }

 private:
  c10::intrusive_ptr<c10d::Work> cpu_, cuda_;
};

// The Work of the CPU side's reconfigure, which is done when the call returns. Not Work::create_from_future: that
// Work refuses wait() with a timeout, which torch's Python Work.wait(timeout) passes.
class CompletedWork : public c10d::Work {
 public:
  explicit CompletedWork(int rank)
      : c10d::Work(rank, c10d::OpType::UNKNOWN, "tuned:reconfigure"),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<at::Device>{})) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>()));
    finish();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

bool TunedBackend::supportsReconfigure() const {
  auto nccl = nccl_.existing();
  return !nccl || nccl->supportsReconfigure();
}

c10d::ReconfigureHandle TunedBackend::get_reconfigure_handle() const {
  auto nccl = nccl_.existing();
  if (!nccl) {
    return cpuReconfigureHandle();
  }
  return joinHandles(cpuReconfigureHandle(), nccl->get_reconfigure_handle());
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  auto nccl = nccl_.existing();
  if (!nccl) {
    return reconfigureCpuSide(opts);
  }
  TORCH_CHECK(nccl->supportsReconfigure(), "tunedist: reconfigure on rank ", rank_,
              ": this group has run CUDA operations, and its NCCL side (", nccl->getBackendName(),
              ", supports_reconfigure=False) cannot take new members in place. Reconfigure a group before its first "
              "CUDA operation, keep CUDA tensors on a group of their own, or use torch's nccl2 backend (the default "
              "for \"nccl\" on torch 2.15)");
  // Both sides get the members in one order, as a list: two sides that ordered a set on their own could give one
  // process two different ranks. A set is ordered as the CPU side orders one (by stable rank).
  std::vector<std::pair<std::string, std::string>> parts;
  std::visit(
      [&](const auto& handles) {
        for (const auto& h : handles) {
          parts.push_back(splitHandle(h, rank_));
        }
      },
      opts.handles);
  if (std::holds_alternative<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles)) {
    std::vector<std::pair<Member, size_t>> order;
    for (size_t i = 0; i < parts.size(); ++i) {
      order.emplace_back(parseHandle(parts[i].first, rank_), i);
    }
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return bySetOrder(a.first, b.first); });
    std::vector<std::pair<std::string, std::string>> sorted;
    for (const auto& [member, i] : order) {
      sorted.push_back(std::move(parts[i]));
    }
    parts = std::move(sorted);
  }
  std::vector<c10d::ReconfigureHandle> cpuHandles, cudaHandles;
  for (auto& [cpu, cuda] : parts) {
    cpuHandles.push_back(std::move(cpu));
    cudaHandles.push_back(std::move(cuda));
  }
  c10d::ReconfigureOptions cpuOpts = opts;
  c10d::ReconfigureOptions cudaOpts = opts;
  cpuOpts.handles = std::move(cpuHandles);
  cudaOpts.handles = std::move(cudaHandles);
  auto cpuWork = reconfigureCpuSide(cpuOpts);  // first: it checks this process's handle, the uuid and the members
  auto cudaWork = nccl->reconfigure(cudaOpts);
  return c10::make_intrusive<BothSidesWork>(rank_, std::move(cpuWork), std::move(cudaWork));
}

c10d::ReconfigureHandle TunedBackend::cpuReconfigureHandle() const {
  std::lock_guard<std::mutex> lock(reconfigureMutex_);
  return formatHandle(rank_, uuid_, stableRank_, instanceId_, storeAddress(groupStore_));
}

c10::intrusive_ptr<c10d::Work> TunedBackend::reconfigureCpuSide(const c10d::ReconfigureOptions& opts) {
  std::lock_guard<std::mutex> lock(reconfigureMutex_);
  const std::string self = formatHandle(rank_, uuid_, stableRank_, instanceId_, storeAddress(groupStore_));
  const std::vector<Member> members = orderedMembers(opts, rank_);
  const auto it = std::find_if(members.begin(), members.end(), [&](const Member& m) { return m.handle == self; });
  TORCH_CHECK(it != members.end(), "tunedist: reconfigure on rank ", rank_, ": this process's handle ", self,
              " is not among the ", members.size(),
              " handles; pass every member's current get_reconfigure_handle(), "
              "this one's included (a handle changes with each reconfigure)");
  TORCH_CHECK(std::find(usedUuids_.begin(), usedUuids_.end(), opts.uuid) == usedUuids_.end(),
              "tunedist: reconfigure on rank ", rank_, ": uuid ", opts.uuid,
              " was used by this group already; every reconfigure needs a fresh uuid");
  usedUuids_.push_back(opts.uuid);
  const int newRank = int(it - members.begin());
  const int newSize = int(members.size());
  const std::chrono::milliseconds timeout = opts.timeout.has_value() && opts.timeout->count() > 0
                                                ? *opts.timeout
                                                : cpu_->effectiveTimeout(c10d::kUnsetTimeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;

  // A connection of its own where the store can give one (TCPStore), as for shrink.
  c10::intrusive_ptr<c10d::Store> base;
  try {
    base = groupStore_->clone();
  } catch (const std::exception&) {
    base = groupStore_;
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(c10::str("tuned_reconfigure/", opts.uuid), base);
  claimUuid(store, members, newRank, opts.uuid, rank_, timeout);

  // Step 3.
  auto cpu = c10::make_intrusive<cpu::CpuBackend>(store, newRank, newSize, cpu_->options());
  try {
    cpu->hostLayout(deadline);
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < newSize; ++r) {
      if (!store->check({core::keys::kHostKeyPrefix + std::to_string(r)})) {
        missing += c10::str(missing.empty() ? "" : ", ", "new rank ", r, " (", members[size_t(r)].handle, ")");
      }
    }
    cpu->abort();
    TORCH_CHECK(false, "tunedist: reconfigure on rank ", rank_, " (new rank ", newRank, " of ", newSize, ", uuid ",
                opts.uuid, "): ", missing.empty() ? "" : c10::str("did not hear from ", missing, ": "), e.what(),
                "; the group keeps its previous members");
  }

  // Step 4.
  abortHooks_->newMembership();
  c10::intrusive_ptr<cpu::CpuBackend> old = cpu_;
  adoptCpuSide(std::move(cpu));
  rank_ = newRank;
  size_ = newSize;
  store_ = store;
  uuid_ = opts.uuid;
  shrinks_ = 0;
  if (!nccl_.existing()) {
    nccl_.rebind(store, newRank, newSize);  // made for the new members at their first CUDA call
  }
  {
    std::lock_guard<std::mutex> coalescing(mutex_);
    coalescing_ = false;
    ncclCoalescing_ = false;
  }
  awaitingMembers_.store(false);
  old->abort();
  return c10::make_intrusive<CompletedWork>(newRank);
}

#endif  // C10D_BACKEND_HAS_RECONFIGURE

void TunedBackend::refuseBeforeReconfigure(const char* op) const {
  TORCH_CHECK(false, "tunedist: ", op, ": rank ", rank_, " of ", size_,
              ": this group was created with enable_reconfigure=True and has no members until it is reconfigured; "
              "every member calls torch.distributed.distributed_c10d._reconfigure(uuid, handles, group) first, "
              "with the handles of _get_reconfigure_handle(group)");
}

void TunedBackend::adoptCpuSide(c10::intrusive_ptr<cpu::CpuBackend> cpu) {
  const int rank = cpu->getRank();
  cpu->setFailureCallback([hooks = abortHooks_, rank, membership = abortHooks_->membership()] {
    hooks->runForFailure(rank, membership);
  });
  if (!getGroupUid().empty()) {
    cpu->setGroupUid(getGroupUid());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (infoHook_) {
    cpu->registerOnCompletionHook([shared = infoHook_](std::shared_ptr<c10d::WorkInfo> info) {
      (*shared)(std::move(info));
    });
  }
#ifdef TUNEDIST_C10D_HAS_COMPLETION_HOOKS
  for (const auto& [id, hook] : completionHooks_) {
    cpu->registerCompletionHook(id, [shared = hook](const c10d::CompletionHookArgs& args) { (*shared)(args); });
  }
#endif
  cpu_ = std::move(cpu);
}

}  // namespace tunedist
