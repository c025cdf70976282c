// TunedBackend::reconfigure and get_reconfigure_handle (torch 2.15's reconfigure, as ProcessGroupGloo defines it),
// with ranks as threads of one process over a shared c10d::HashStore: the handle's format, the refusal of every
// operation before the first reconfigure, a list (ranks by position) against a set (ranks by stable rank), a
// reused uuid refused by the process that used it and, through the claim in the store, by one that did not, a
// member left out and a new process (a replacement) taking its place, and the collectives and send/recv of every
// new membership against closed-form values. tests/python/test_reconfigure.py runs the same in real processes.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cctype>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "backend/tuned_backend.h"

#ifdef C10D_BACKEND_HAS_RECONFIGURE
namespace {

using tunedist_test::errorOf;

using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;
constexpr std::chrono::milliseconds kTimeout{60000};

// A group in the reconfigure regime (init_process_group(..., enable_reconfigure=True)): `rank` is its stable rank.
BackendPtr reconfigurable(const StorePtr& store, int rank, int size) {
  return tunedist::TunedBackend::create(store, rank, size, kTimeout, {}, nullptr, /*enableReconfigure=*/true,
                                        /*stableRank=*/rank);
}

// One test's stores: `group` for the backends, `oob` for the out-of-band exchange of handles.
struct Stores {
  StorePtr group;
  StorePtr oob;
};

Stores freshStores() {
  static int counter = 0;
  auto base = c10::make_intrusive<c10d::HashStore>();
  const std::string id = "test" + std::to_string(++counter) + "/";
  return {c10::make_intrusive<c10d::PrefixStore>(id + "group", base),
          c10::make_intrusive<c10d::PrefixStore>(id + "oob", base)};
}

using tunedist_test::runThreads;

void expect(bool cond, const std::string& what) {
  if (!cond) {
    throw std::runtime_error(what);
  }
}

void expectContains(const std::string& text, const std::string& part, const std::string& what) {
  expect(text.find(part) != std::string::npos, what + ": '" + part + "' is not in: " + text);
}

// The out-of-band step: every member leaves its current handle under tag/key; returns the `count` handles by key.
std::vector<std::string> exchange(const StorePtr& oob, const BackendPtr& b, const std::string& tag, int key,
                                  int count) {
  const std::string mine = b->get_reconfigure_handle();
  oob->set(tag + "/" + std::to_string(key), mine);
  std::vector<std::string> handles;
  for (int k = 0; k < count; ++k) {
    const std::vector<uint8_t> v = oob->get(tag + "/" + std::to_string(k));
    handles.emplace_back(v.begin(), v.end());
  }
  return handles;
}

void reconfigure(const BackendPtr& b, int64_t uuid, std::vector<std::string> handles) {
  c10d::ReconfigureOptions opts;
  opts.uuid = uuid;
  opts.handles = std::move(handles);
  b->reconfigure(opts)->wait();
}

void reconfigureSet(const BackendPtr& b, int64_t uuid, const std::vector<std::string>& handles) {
  c10d::ReconfigureOptions opts;
  opts.uuid = uuid;
  opts.handles = std::unordered_set<std::string>(handles.begin(), handles.end());
  b->reconfigure(opts)->wait();
}

// Every member's `id`, gathered in the group's rank order.
std::vector<int64_t> gatherIds(const BackendPtr& b, int64_t id) {
  at::Tensor mine = at::full({1}, id, at::kLong);
  at::Tensor all = at::empty({b->getSize()}, at::kLong);
  b->_allgather_base(all, mine)->wait();
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

// 0, 1, ..., size - 1, or the same reversed.
std::vector<int64_t> stableRanks(int size, bool reversed) {
  std::vector<int64_t> ids;
  for (int k = 0; k < size; ++k) {
    ids.push_back(reversed ? size - 1 - k : k);
  }
  return ids;
}

// all_reduce, broadcast from the last rank and a send/recv ring on the current membership, against closed forms.
void checkCollectives(const BackendPtr& b, const std::string& when) {
  const int rank = b->getRank(), size = b->getSize();
  std::vector<at::Tensor> t{at::full({1001}, double(rank + 1), at::kFloat)};
  b->allreduce(t)->wait();
  expect(at::equal(t[0], at::full({1001}, double(size * (size + 1) / 2), at::kFloat)),
         when + ": all_reduce on rank " + std::to_string(rank));
  std::vector<at::Tensor> c{at::full({7}, double(rank == size - 1 ? 42 : -1), at::kDouble)};
  c10d::BroadcastOptions bopts;
  bopts.rootRank = size - 1;
  b->broadcast(c, bopts)->wait();
  expect(at::equal(c[0], at::full({7}, 42.0, at::kDouble)), when + ": broadcast on rank " + std::to_string(rank));
  if (size > 1) {
    std::vector<at::Tensor> out{at::full({300}, double(rank), at::kInt)};
    std::vector<at::Tensor> in{at::empty({300}, at::kInt)};
    auto sent = b->send(out, (rank + 1) % size, 5);
    b->recv(in, (rank + size - 1) % size, 5)->wait();
    sent->wait();
    expect(at::equal(in[0], at::full({300}, double((rank + size - 1) % size), at::kInt)),
           when + ": recv on rank " + std::to_string(rank));
  }
}

}  // namespace

TEST_CASE("reconfigure: the handle, and every operation refused before the first reconfigure",
          "[backend][reconfigure]") {
  const int size = GENERATE(1, 2, 3);
  Stores s = freshStores();
  runThreads(size, [&](int r) {
    BackendPtr b = reconfigurable(s.group, r, size);
    // tuned:<rank>:<uuid, -1 before the first>:<stable rank>:<16 hex digits>:<TCPStore host:port, none here>
    const std::string h = b->get_reconfigure_handle();
    const std::string head = "tuned:" + std::to_string(r) + ":-1:" + std::to_string(r) + ":";
    expect(h.rfind(head, 0) == 0 && h.size() == head.size() + 17 && h.back() == ':', "handle '" + h + "'");
    expect(std::all_of(h.begin() + long(head.size()), h.end() - 1, [](char ch) { return std::isxdigit(ch) != 0; }),
           "instance id of handle '" + h + "'");
    const std::string refused = "rank " + std::to_string(r) + " of " + std::to_string(size) +
                                ": this group was created with enable_reconfigure=True";
    std::vector<at::Tensor> t{at::ones({4})};
    expectContains(errorOf([&] { b->allreduce(t); }), "tunedist: all_reduce: " + refused, "all_reduce");
    expectContains(errorOf([&] { b->barrier(); }), refused, "barrier");
    if (size > 1) {
      expectContains(errorOf([&] { b->send(t, (r + 1) % size, 0); }), refused, "send");
    }
    expectContains(errorOf([&] { reconfigure(b, 1, {"gloo:0"}); }), "is not a `tuned` reconfigure handle",
                   "a handle of another backend");
    auto handles = exchange(s.oob, b, "first", r, size);
    std::vector<std::string> others;
    for (int k = 0; k < size; ++k) {
      if (k != r) {
        others.push_back(handles[size_t(k)]);
      }
    }
    if (!others.empty()) {
      expectContains(errorOf([&] { reconfigure(b, 1, others); }), "is not among the", "own handle missing");
    }
    reconfigure(b, 2, handles);
    expect(b->getRank() == r && b->getSize() == size, "rank and size after the first reconfigure");
    const std::string after = b->get_reconfigure_handle();
    expect(after.rfind("tuned:" + std::to_string(r) + ":2:" + std::to_string(r) + ":", 0) == 0,
           "handle after reconfigure '" + after + "'");
    checkCollectives(b, "after the first reconfigure");
  });
}

TEST_CASE("reconfigure: a list gives ranks by position, a set by stable rank", "[backend][reconfigure]") {
  const int size = GENERATE(2, 3, 4);
  Stores s = freshStores();
  runThreads(size, [&](int r) {
    BackendPtr b = reconfigurable(s.group, r, size);
    auto handles = exchange(s.oob, b, "list", r, size);
    std::reverse(handles.begin(), handles.end());
    reconfigure(b, 10, handles);
    expect(b->getRank() == size - 1 - r, "rank from the reversed list");
    expect(gatherIds(b, r) == stableRanks(size, true), "stable ranks in the reversed group's order");
    checkCollectives(b, "after the list");
    // Now a set, handed over in reversed key order: the backend orders it by stable rank, back to launch order.
    handles = exchange(s.oob, b, "set", size - 1 - r, size);
    reconfigureSet(b, 11, handles);
    expect(b->getRank() == r, "rank from the set");
    expect(gatherIds(b, r) == stableRanks(size, false), "stable ranks in the set's order");
    checkCollectives(b, "after the set");
  });
}

TEST_CASE("reconfigure: a uuid is used once, by the same process and through the store's claim",
          "[backend][reconfigure]") {
  Stores s = freshStores();
  runThreads(3, [&](int r) {
    BackendPtr b = reconfigurable(s.group, r, 3);
    if (r < 2) {
      // Threads 0 and 1 form a group of two under uuid 7.
      reconfigure(b, 7, exchange(s.oob, b, "pair", r, 2));
      checkCollectives(b, "the pair");
      auto again = exchange(s.oob, b, "again", r, 2);
      expectContains(errorOf([&] { reconfigure(b, 7, again); }), "uuid 7 was used by this group already",
                     "the same uuid again");
      s.oob->set("pair_done/" + std::to_string(r), std::string("1"));
      checkCollectives(b, "the pair after the refusal");
      s.oob->wait({"alone_done"});
      return;
    }
    // Thread 2 never took part in uuid 7: the pair's new rank 0 claimed it.
    s.oob->wait({"pair_done/0", "pair_done/1"});
    const std::vector<std::string> alone{b->get_reconfigure_handle()};
    expectContains(errorOf([&] { reconfigure(b, 7, alone); }),
                   "uuid 7 was used already (claimed by tuned:0:-1:0:", "a uuid claimed by another membership");
    reconfigure(b, 8, alone);
    expect(b->getRank() == 0 && b->getSize() == 1, "a group of one");
    checkCollectives(b, "the group of one");
    s.oob->set("alone_done", std::string("1"));
  });
}

TEST_CASE("reconfigure: a member left out, then a new process takes its place", "[backend][reconfigure]") {
  const int size = GENERATE(2, 3);
  const int leaver = GENERATE(0, 1);
  Stores s = freshStores();
  // Threads 0..size-1 are the first members; thread `size` is the replacement for stable rank `leaver`.
  runThreads(size + 1, [&](int t) {
    if (t == leaver) {
      BackendPtr b = reconfigurable(s.group, t, size);
      reconfigure(b, 20, exchange(s.oob, b, "all", t, size));
      checkCollectives(b, "the full group");
      s.oob->set("left", std::string("1"));
      return;  // destroyed without a word: the others go on without it
    }
    if (t == size) {
      s.oob->wait({"shrunk"});
      // A new process given the rank it replaces: its group is in the reconfigure regime, on the job's store.
      BackendPtr b = reconfigurable(s.group, leaver, size);
      s.oob->set("joined/" + std::to_string(leaver), std::string("1"));
      reconfigureSet(b, 22, exchange(s.oob, b, "back", leaver, size));
      expect(b->getRank() == leaver && b->getSize() == size, "the replacement's rank");
      expect(gatherIds(b, leaver).size() == size_t(size), "the full group again");
      checkCollectives(b, "back at full size");
      return;
    }
    BackendPtr b = reconfigurable(s.group, t, size);
    reconfigure(b, 20, exchange(s.oob, b, "all", t, size));
    checkCollectives(b, "the full group");
    s.oob->wait({"left"});
    // The survivors, as a set of their new handles: new ranks in stable-rank order, without the leaver.
    std::vector<std::string> survivors;
    const std::string mine = b->get_reconfigure_handle();
    s.oob->set("rest/" + std::to_string(t), mine);
    for (int k = 0; k < size; ++k) {
      if (k != leaver) {
        const auto v = s.oob->get("rest/" + std::to_string(k));
        survivors.emplace_back(v.begin(), v.end());
      }
    }
    reconfigureSet(b, 21, survivors);
    expect(b->getSize() == size - 1 && b->getRank() == (t < leaver ? t : t - 1), "a survivor's new rank");
    checkCollectives(b, "without the leaver");
    if (b->getRank() == 0) {
      s.oob->set("shrunk", std::string("1"));
    }
    // The replacement comes in: it takes the leaver's place in the set (its stable rank).
    s.oob->wait({"joined/" + std::to_string(leaver)});
    reconfigureSet(b, 22, exchange(s.oob, b, "back", t, size));
    expect(b->getRank() == t && b->getSize() == size, "a survivor's rank at full size");
    expect(gatherIds(b, t) == stableRanks(size, false), "stable ranks at full size");
    checkCollectives(b, "back at full size");
  });
}
#endif  // C10D_BACKEND_HAS_RECONFIGURE
