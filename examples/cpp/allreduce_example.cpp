// All-reduce 1M floats over the `tuned` backend from plain C++, one process per rank.
//
//   allreduce_example <rank> <world_size> <store>
//
// <store> is a TCP port, where rank 0 serves a c10d::TCPStore on 127.0.0.1, or else the path of a
// c10d::FileStore that does not exist yet. Every rank contributes rank + 1, so each element of the sum must equal
// world_size * (world_size + 1) / 2. On success each rank prints "allreduce ok" and exits with 0. Otherwise it
// writes the reason to stderr and exits with 1 (2 for a usage error).
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <tunedist/tunedist.h>

namespace {

constexpr int64_t kNumel = 1 << 20;
constexpr std::chrono::seconds kTimeout{60};

struct Args {
  int rank = 0;
  int worldSize = 0;
  std::string store;
};

bool isPort(const std::string& s) {
  return !s.empty() && s.size() <= 5 && s.find_first_not_of("0123456789") == std::string::npos;
}

Args parseArgs(int argc, char** argv) {
  TORCH_CHECK(argc == 4, "usage: ", argv[0], " <rank> <world_size> <tcp_port | file_store_path>");
  Args args;
  args.rank = std::stoi(argv[1]);
  args.worldSize = std::stoi(argv[2]);
  args.store = argv[3];
  TORCH_CHECK(args.worldSize >= 1 && args.rank >= 0 && args.rank < args.worldSize, "rank ", args.rank,
              " is not in [0, world_size = ", args.worldSize, ")");
  return args;
}

c10::intrusive_ptr<c10d::Store> makeStore(const Args& args) {
  if (isPort(args.store)) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(std::stoi(args.store));
    opts.isServer = args.rank == 0;
    opts.numWorkers = args.worldSize;
    opts.timeout = kTimeout;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  }
  return c10::make_intrusive<c10d::FileStore>(args.store, args.worldSize);
}

// Returns an empty string when every element equals `expected`, else a description of the first mismatch.
std::string checkAllEqual(const at::Tensor& t, float expected) {
  const float* data = t.const_data_ptr<float>();
  int64_t wrong = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (data[i] != expected) {
      wrong += 1;
      first = first < 0 ? i : first;
    }
  }
  if (wrong == 0) {
    return "";
  }
  return c10::str(wrong, " of ", t.numel(), " elements are wrong; the first is [", first, "] = ", data[first],
                  ", expected ", expected);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parseArgs(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "allreduce_example: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "allreduce_example: bad argument (" << e.what() << ")\n";
    return 2;
  }
  try {
    auto store = makeStore(args);
    c10::intrusive_ptr<c10d::Backend> backend = tunedist::createBackend(store, args.rank, args.worldSize, kTimeout);
    if (args.rank == 0) {
      std::cout << tunedist::versionString() << "\n";
    }

    std::vector<at::Tensor> tensors{at::full({kNumel}, static_cast<float>(args.rank + 1), at::kFloat)};
    backend->allreduce(tensors)->wait();  // AllreduceOptions{} sums

    // Small integers, so the float sum is exact in any order.
    const float expected = static_cast<float>(args.worldSize) * static_cast<float>(args.worldSize + 1) / 2.0f;
    std::string error = checkAllEqual(tensors[0], expected);
    TORCH_CHECK(error.empty(), "allreduce of ", kNumel, " floats: ", error);
    std::cout << "rank " << args.rank << "/" << args.worldSize << ": allreduce ok (" << kNumel << " floats, each "
              << expected << ")\n";
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "allreduce_example: rank " << args.rank << "/" << args.worldSize
              << " failed: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "allreduce_example: rank " << args.rank << "/" << args.worldSize << " failed: " << e.what() << "\n";
    return 1;
  }
}
