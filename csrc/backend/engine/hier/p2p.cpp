#include "backend/engine/hier/p2p.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

namespace tunedist::engine::hier {
namespace {

std::chrono::milliseconds left(CrossHostP2p::Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - CrossHostP2p::Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

at::Tensor bytesOf(const at::Tensor& t) { return t.view({-1}).view(at::kByte); }

}  // namespace

// One thread that runs tasks in order. Destroyed while a task is still blocked (a peer that never answers), the
// thread is detached with its state, so shutting a group down never waits for a dead host.
class CrossHostP2p::Lane {
 public:
  Lane() : state_(std::make_shared<State>()) {
    std::thread([s = state_] { run(*s); }).swap(thread_);
  }
  ~Lane() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->stop = true;
    state_->cv.notify_all();
    const bool busy = state_->busy || !state_->tasks.empty();
    lock.unlock();
    if (busy) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  void push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->tasks.push_back(std::move(task));
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    bool stop = false;
    bool busy = false;
  };
  static void run(State& s) {
    std::unique_lock<std::mutex> lock(s.mutex);
    for (;;) {
      s.cv.wait(lock, [&] { return s.stop || !s.tasks.empty(); });
      if (s.tasks.empty()) {
        return;
      }
      auto task = std::move(s.tasks.front());
      s.tasks.pop_front();
      s.busy = true;
      lock.unlock();
      task();  // tasks catch their own errors and report them through their Done
      lock.lock();
      s.busy = false;
    }
  }
  std::shared_ptr<State> state_;
  std::thread thread_;
};

CrossHostP2p::~CrossHostP2p() {
  std::lock_guard<std::mutex> lock(mutex_);
  peers_.clear();
}

CrossHostP2p::Peer& CrossHostP2p::peer(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[rank];
  if (!p.posts) {
    p.posts = std::make_shared<Lane>();
    p.sendWaits = std::make_shared<Lane>();
    p.recvs = std::make_shared<Lane>();
  }
  return p;
}

void CrossHostP2p::isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  Peer& p = peer(dst);
  std::shared_ptr<CrossHost> x = x_;
  Lane* waits = p.sendWaits.get();
  p.posts->push([x, waits, dst, tag, data, deadline, done] {
    try {
      auto pg = x->group({std::min(dst, x->rank()), std::max(dst, x->rank())}, "p2p");
      const int peerIndex = dst < x->rank() ? 0 : 1;
      const int64_t bytes = data.numel() * int64_t(data.element_size());
      std::vector<at::Tensor> header{at::tensor({bytes, int64_t(data.scalar_type())}, at::kLong)};
      auto headerWork = pg->send(header, peerIndex, tag);
      c10::intrusive_ptr<c10d::Work> payloadWork;
      if (bytes > 0) {
        std::vector<at::Tensor> payload{bytesOf(data)};
        payloadWork = pg->send(payload, peerIndex, tag);
        x->countData(size_t(bytes));
      }
      waits->push([headerWork, payloadWork, header, data, deadline, dst, done] {
        try {
          headerWork->wait(left(deadline));
          if (payloadWork) {
            payloadWork->wait(left(deadline));
          }
        } catch (...) {
          done(std::current_exception(), dst);
          return;
        }
        done(nullptr, dst);
      });
    } catch (...) {
      done(std::current_exception(), dst);
    }
  });
}

void CrossHostP2p::irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  std::shared_ptr<CrossHost> x = x_;
  peer(src).recvs->push([x, src, tag, data, deadline, done] {
    try {
      auto pg = x->group({std::min(src, x->rank()), std::max(src, x->rank())}, "p2p");
      const int peerIndex = src < x->rank() ? 0 : 1;
      std::vector<at::Tensor> header{at::empty({2}, at::kLong)};
      pg->recv(header, peerIndex, tag)->wait(left(deadline));
      const int64_t bytes = header[0].data_ptr<int64_t>()[0];
      const int64_t expected = data.numel() * int64_t(data.element_size());
      std::vector<at::Tensor> payload{bytes == expected ? bytesOf(data) : at::empty({bytes}, at::kByte)};
      if (bytes > 0) {
        pg->recv(payload, peerIndex, tag)->wait(left(deadline));
      }
      TORCH_CHECK(bytes == expected, "tunedist: recv on rank ", x->rank(), " from rank ", src, " (tag ", tag,
                  "): the message has ", bytes, " bytes but the receive expects ", expected,
                  " bytes; sizes must match exactly");
    } catch (...) {
      done(std::current_exception(), src);
      return;
    }
    done(nullptr, src);
  });
}

}  // namespace tunedist::engine::hier
