#include "backend/engine/hier/cross_host.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <condition_variable>
#include <future>
#include <thread>

#include "core/error.h"
#include "core/store_keys.h"

namespace tunedist::engine::hier {
namespace {

using core::keys::kGlooPrefix;
constexpr const char* kAbortKey = core::keys::kCrossAbort;
// While waiting for a gloo operation, the store is checked for another host's failure after kFirstAbortCheck,
// then this often.
constexpr auto kFirstAbortCheck = std::chrono::milliseconds(20);
constexpr auto kAbortCheckPeriod = std::chrono::milliseconds(100);

// Blocks until gloo's worker completes `work` (a callback on its future wakes us: no polling in between), calling
// `checkAbort` after kFirstAbortCheck and then every kAbortCheckPeriod; throws TimeoutError at ctx's deadline.
void waitForCompletion(const c10::intrusive_ptr<c10d::Work>& work, const core::OpContext& ctx,
                       const std::function<void()>& checkAbort) {
  struct Signal {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto signal = std::make_shared<Signal>();
  work->getFuture()->addCallback([signal](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(signal->mutex);
    signal->done = true;
    signal->cv.notify_all();
  });
  const auto start = std::chrono::steady_clock::now();
  auto nextCheck = start + kFirstAbortCheck;
  std::unique_lock<std::mutex> lock(signal->mutex);
  while (!signal->done) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= ctx.deadline) {
      throw core::TimeoutError(c10::str("Timed out after ",
                                        std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(),
                                        " ms waiting for the ranks on other hosts"));
    }
    if (now >= nextCheck) {
      lock.unlock();
      checkAbort();
      lock.lock();
      nextCheck = now + kAbortCheckPeriod;
      continue;
    }
    signal->cv.wait_until(lock, std::min(nextCheck, ctx.deadline));
  }
}

}  // namespace

CrossHost::CrossHost(c10::intrusive_ptr<c10d::Store> store, int rank, topology::HostLayout layout, GlooFactory factory,
                     std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      rank_(rank),
      layout_(std::move(layout)),
      factory_(std::move(factory)),
      timeout_(timeout) {
  TORCH_CHECK(factory_, "tunedist: rank ", rank_, ": this process group spans ", layout_.numHosts(),
              " hosts, which needs gloo between hosts, but no gloo factory was given (a group made from C++ with "
              "tunedist::createBackend must fit on one host; `import tunedist` in Python sets the factory)");
}

CrossHost::~CrossHost() {
  if (failed()) {
    // See the header: a failed group's gloo groups may hold operations stuck on dead peers.
    for (auto& [members, group] : groups_) {
      if (group.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        try {
          (void)c10::intrusive_ptr<c10d::Backend>(group.get()).release();
        } catch (...) {  // a creation that failed left no group
        }
      }
    }
  }
}

std::vector<int> CrossHost::leaders() const {
  std::vector<int> out;
  for (const auto& h : layout_.hosts) {
    out.push_back(h[0]);
  }
  return out;
}

std::vector<int> CrossHost::everyone() const {
  std::vector<int> out(layout_.hostOf.size());
  for (size_t r = 0; r < out.size(); ++r) {
    out[r] = int(r);
  }
  return out;
}

int CrossHost::indexIn(const std::vector<int>& members) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank_) {
      return int(i);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "rank ", rank_, " is not in gloo group ", topology::ranksText(members));
}

c10::intrusive_ptr<c10d::Backend> CrossHost::group(const std::vector<int>& members, const std::string& kind) {
  const auto key = std::make_pair(kind, members);
  std::promise<c10::intrusive_ptr<c10d::Backend>> creation;
  std::shared_future<c10::intrusive_ptr<c10d::Backend>> group;
  bool create = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(key);
    create = it == groups_.end();
    group = create ? groups_.emplace(key, creation.get_future().share()).first->second : it->second;
  }
  if (!create) {
    return group.get();  // made, or being made by another thread of this rank; rethrows its error
  }
  // Creation waits for the other members: not under the lock, so another group may be created meanwhile.
  // Point-to-point pairs are created on the pairs' own threads, concurrently: each creation gets its own store
  // connection, since gloo's rendezvous blocks in store waits and one TCPStore client serialises its calls (two
  // creations sharing one could wait on each other across ranks in a cycle, e.g. a ring of sends).
  try {
    std::string name = kind + ":";
    for (int r : members) {
      name += std::to_string(r) + ",";
    }
    auto base = kind == "c" ? store_ : store_->clone();
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(kGlooPrefix + name, base);
    auto pg = factory_(prefixed, indexIn(members), int(members.size()), timeout_);
    TORCH_CHECK(pg, "tunedist: the gloo factory returned no backend");
    creation.set_value(std::move(pg));
  } catch (...) {
    creation.set_exception(std::current_exception());  // for the threads waiting on this creation
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.erase(key);  // a later call tries again, as before a first creation
  }
  return group.get();
}

std::chrono::milliseconds CrossHost::remaining(const core::OpContext& ctx) const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string CrossHost::recordedFailure() {
  if (!store_->check({kAbortKey})) {
    return {};
  }
  std::vector<uint8_t> v = store_->get(kAbortKey);
  return std::string(v.begin(), v.end());
}

void CrossHost::checkRemoteAbort() {
  if (std::string recorded = recordedFailure(); !recorded.empty()) {
    fail(recorded);
  }
}

void CrossHost::wait(const c10::intrusive_ptr<c10d::Work>& work, const core::OpContext& ctx) {
  glooOps_.fetch_add(1, std::memory_order_relaxed);
  if (!work->isCompleted()) {
    waitForCompletion(work, ctx, [&] {
      checkRemoteAbort();
      throwIfFailed(ctx);
    });
  }
  work->wait();
}

std::vector<std::vector<int64_t>> CrossHost::gatherDescs(const std::vector<int>& members, const core::OpContext& ctx,
                                                         const std::vector<int64_t>& desc) {
  at::Tensor mine = at::tensor(desc, at::kLong);
  std::vector<at::Tensor> ins{mine};
  std::vector<std::vector<at::Tensor>> outs(1);
  for (size_t i = 0; i < members.size(); ++i) {
    outs[0].push_back(at::empty_like(mine));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = remaining(ctx);
  wait(group(members)->allgather(outs, ins, opts), ctx);
  metaBytes_.fetch_add(desc.size() * sizeof(int64_t) * members.size(), std::memory_order_relaxed);
  std::vector<std::vector<int64_t>> all;
  for (const auto& t : outs[0]) {
    const int64_t* p = t.data_ptr<int64_t>();
    all.emplace_back(p, p + t.numel());
  }
  return all;
}

void CrossHost::agree(const std::vector<int>& members, const core::OpContext& ctx, const std::vector<int64_t>& desc,
                      const std::vector<const char*>& fieldNames) {
  auto all = gatherDescs(members, ctx, desc);
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t f = 0; f < desc.size(); ++f) {
      if (all[i][f] != desc[f]) {
        const char* field = f < fieldNames.size() ? fieldNames[f] : "metadata";
        // Field 0 is the op code: named, since hosts calling different collectives is the likely mistake.
        const auto value = [f](int64_t v) {
          return f == 0 ? std::string(shm::opCodeName(static_cast<shm::OpCode>(v))) : std::to_string(v);
        };
        TORCH_CHECK(false, "ranks disagree on the operation: rank ", members[i], " has ", field, "=", value(all[i][f]),
                    " but rank ", rank_, " has ", field, "=", value(desc[f]),
                    " (every rank must call the same collective with matching sizes, dtypes, ops and roots)");
      }
    }
  }
}

CrossHostStats CrossHost::stats() const {
  return CrossHostStats{dataBytes_.load(), metaBytes_.load(), glooOps_.load()};
}

void CrossHost::throwIfFailed(const core::OpContext& ctx) {
  if (!failed()) {
    return;
  }
  std::lock_guard<std::mutex> lock(failMutex_);
  throw core::Error(c10::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") on rank ", rank_,
                             ": the process group is unusable after an earlier failure: ", failure_,
                             " Destroy the group and create a new one."));
}

void CrossHost::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failMutex_);
    if (failed_.load()) {
      return;
    }
    failure_ = message;
    failed_.store(true, std::memory_order_release);
  }
  try {
    // compareSet keeps the first failure of the group: later ones do not overwrite it.
    std::vector<uint8_t> none;
    store_->compareSet(kAbortKey, none, std::vector<uint8_t>(message.begin(), message.end()));
  } catch (const std::exception&) {
    // The store is gone with its host: peers then fail on gloo or on the store themselves.
  }
}

namespace {

// The first cause of a failure that reached this rank as a closed connection: the failure a rank recorded in the
// store (fail()), looked for until kFirstCauseGrace (or the op's deadline) passes; "" if none came.
std::string firstCause(CrossHost& x, const core::OpContext& ctx) {
  const auto until = std::min(ctx.deadline, std::chrono::steady_clock::now() + kFirstCauseGrace);
  while (true) {
    try {
      if (std::string recorded = x.recordedFailure(); !recorded.empty()) {
        return recorded;
      }
    } catch (const std::exception&) {
      return {};  // the store is gone with its host: nothing recorded can be read
    }
    if (std::chrono::steady_clock::now() >= until) {
      return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

void runCrossHost(CrossHost& x, const core::OpContext& ctx, const std::function<void(const std::string&)>& abortLocal,
                  const std::function<void()>& body) {
  x.throwIfFailed(ctx);
  try {
    body();
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
      what = ce->what_without_backtrace();
    }
    std::string full;
    if (what.rfind("tunedist: ", 0) == 0) {
      full = what;  // already ours: from this host's shared memory, or a failure shared by another rank
      if (x.localSize() > 1 && what.find("shared-memory ranks") == std::string::npos) {
        full += c10::str(" [host ", x.host(), ": shared-memory ranks 0..", x.localSize() - 1, " are group ranks ",
                         topology::ranksText(x.layout().hosts[size_t(x.host())]), "]");
      }
    } else {
      // Classified by type: gloo's own errors are not c10::Errors (gloo::IoException: a rank on another host died,
      // closed its connection, or the network failed), nor are the store's network errors other than
      // c10::DistNetworkError; anything else (a c10::Error from a torch op) is reported as it is.
      const bool closed = dynamic_cast<const c10::Error*>(&e) == nullptr ||
                          dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr;
      // A rank that failed first records why in the store before it raises and leaves, and its leaving closes this
      // rank's connections: every rank then reports that first cause (the store outlives the ranks under torchrun,
      // whose agent hosts it).
      if (std::string first = closed ? firstCause(x, ctx) : std::string(); !first.empty()) {
        full = c10::str(first, " [rank ", x.rank(), " then saw its connection close: ", what, "]");
      } else {
        full = c10::str("tunedist: ", ctx.name, " (seq ", ctx.seq, ") failed on rank ", x.rank(), " of ", x.size(),
                        " (host ", x.host(), " of ", x.layout().numHosts(),
                        "): ", closed ? "a rank on another host is dead or closed its connection: " : "", what);
      }
    }
    x.fail(full);
    abortLocal(full);
    if (dynamic_cast<const core::TimeoutError*>(&e) != nullptr) {
      throw core::TimeoutError(full);
    }
    throw core::Error(full);
  }
}

}  // namespace tunedist::engine::hier
