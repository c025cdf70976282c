// CompletionHooks: what a group tells about each operation that finished, for pg._register_on_completion_hook (a
// c10d::WorkInfo per operation: op type, sequence number, when it was issued and when it finished, and how long it
// ran) and for torch's keyed completion hooks (Backend::registerCompletionHook: the Work's completion key and the
// same duration, which torch's flight recorder uses to retire an entry).
//
// With no hook registered an operation pays one relaxed atomic load (active()): the executor takes no time stamps
// and reports nothing. The WorkInfo hook runs on a thread of its own, as ProcessGroupNCCL runs it: it is a Python
// function that takes the GIL, and a collective must not wait for it. Keyed hooks run at once on the thread that
// finished the operation, while the Work is alive (its key is its address), as torch's contract for them says
// (short, no GIL, no calls back into the backend).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace tunedist::cpu {

// Made with std::make_shared: the WorkInfo hook's thread holds it.
class CompletionHooks : public std::enable_shared_from_this<CompletionHooks> {
 public:
  using Clock = std::chrono::steady_clock;
  using InfoHook = std::function<void(std::shared_ptr<c10d::WorkInfo>)>;

  // One finished operation.
  struct Record {
    c10d::OpType type;
    uint64_t seq;
    Clock::time_point issued;    // when the caller issued it
    Clock::time_point started;   // when it began to run (after any operations queued before it)
    Clock::time_point finished;  // when it had run
    uint64_t completionKey;      // Work::getCompletionKey of its Work; 0 for a synchronous call that made none
  };

  explicit CompletionHooks(int rank) : rank_(rank) {}
  ~CompletionHooks();
  CompletionHooks(const CompletionHooks&) = delete;
  CompletionHooks& operator=(const CompletionHooks&) = delete;

  // Whether any hook is registered: the executor stamps and reports operations only then.
  bool active() const noexcept { return active_.load(std::memory_order_relaxed); }
  // Now, where a hook is registered; else the epoch, which tells report() that this operation is not followed.
  Clock::time_point stamp() const { return active() ? Clock::now() : Clock::time_point{}; }

  // The WorkInfo hook (one per group, as ProcessGroupNCCL allows); starts its thread.
  void setInfoHook(InfoHook hook);
  void addKeyed(int64_t id, std::function<void(uint64_t key, std::optional<float> durationMs)> hook);
  void removeKeyed(int64_t id);

  // Tells the hooks of one operation that finished successfully (failed ones are not reported, as torch's hooks
  // expect). Does nothing when the operation was issued with no hook registered (record.issued is the epoch).
  void report(const Record& record);
  // Returns once the WorkInfo hook has run for every operation reported so far: torch's waitForPendingWorks, which
  // destroy_process_group calls (where the group has an on-completion hook) before the interpreter may go away.
  // Operations still running are reported, and their hook run, when they finish. Returns at once on the hook's own
  // thread.
  void drain();
  // Runs the WorkInfo hook for what is already reported, then stops its thread. Idempotent.
  void shutdown();

 private:
  void infoLoop();
  void refreshActiveLocked();

  const int rank_;
  std::atomic<bool> active_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  InfoHook info_;
  std::deque<Record> pending_;  // for the WorkInfo hook's thread
  bool running_ = false;        // the hook's thread is running a batch taken from pending_
  std::condition_variable drained_;
  bool stop_ = false;
  std::thread infoThread_;
  std::map<int64_t, std::function<void(uint64_t, std::optional<float>)>> keyed_;
};

}  // namespace tunedist::cpu
