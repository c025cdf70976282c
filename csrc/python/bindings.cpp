// The Python module tunedist._C: the backend creator handed to torch.distributed.Backend.register_backend, plus
// build facts and the benchmark's copy-bandwidth probe. The DDP hooks' bindings are in hooks_bindings.cpp.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "backend/cpu/symm_mem/allocator.h"
#include "backend/tuned_backend.h"
#include "kernels/reduce.h"
#include "python/hooks_bindings.h"
#include "shm/zero_copy/zero_copy.h"
#include "tunedist/tunedist.h"

namespace py = pybind11;

namespace tunedist::python {
namespace {

// Holds a Python callable for C++ code that calls it on other threads: it is called and released under the GIL (or
// leaked when the interpreter is already gone).
std::shared_ptr<py::object> holdCallable(const py::object& callable) {
  return std::shared_ptr<py::object>(new py::object(callable), [](py::object* o) {
    if (Py_IsInitialized() == 0) {
      return;
    }
    py::gil_scoped_acquire gil;
    delete o;
  });
}

// Wraps a Python callable (or None) as the NCCL side's creation hook. The hook runs on whichever thread made the
// first CUDA call, usually without the GIL.
tunedist::cuda::NcclSide::CreatedHook ncclCreatedHook(const py::object& onNcclCreated) {
  if (onNcclCreated.is_none()) {
    return {};
  }
  auto holder = holdCallable(onNcclCreated);
  return [holder](int rank, int size) {
    py::gil_scoped_acquire gil;
    try {
      (*holder)(rank, size);
    } catch (py::error_already_set& e) {
      // A failing log hook must not fail the collective that created the NCCL side.
      e.discard_as_unraisable("tunedist: on_nccl_created");
    }
  };
}

// Wraps the Python callable that makes a gloo group (store, rank, size, timeout) -> ProcessGroupGloo, for the
// groups between hosts. Called on the backend's worker thread.
tunedist::engine::hier::GlooFactory wrapGlooFactory(const py::object& callable) {
  if (callable.is_none()) {
    return nullptr;
  }
  auto fn = holdCallable(callable);
  return [fn](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    return (*fn)(store, rank, size, timeout).cast<c10::intrusive_ptr<c10d::Backend>>();
  };
}

// Wraps the Python callable that makes the NCCL side's backend, (store, rank, size, timeout, group_name, device) ->
// a c10d Backend, or None to leave the choice to C++ (tunedist._CudaSide: torch's creator for "nccl"). Called with
// the GIL taken, on the thread of the group's first CUDA call; a Python error becomes a c10::Error, to which the
// caller adds op and rank.
tunedist::cuda::NcclSide::Factory wrapNcclFactory(const py::object& callable) {
  if (callable.is_none()) {
    return nullptr;
  }
  auto fn = holdCallable(callable);
  return [fn](const tunedist::cuda::NcclSide::CreateArgs& args) -> c10::intrusive_ptr<c10d::Backend> {
    py::gil_scoped_acquire gil;
    try {
      py::object device = args.device.has_value() ? py::cast(*args.device) : py::none();
      py::object made = (*fn)(args.store, args.rank, args.size, args.timeout, args.groupUid, device);
      if (made.is_none()) {
        return nullptr;
      }
      return made.cast<c10::intrusive_ptr<c10d::Backend>>();
    } catch (const py::error_already_set& e) {
      TORCH_CHECK(false, "making the CUDA side: ", e.what());
    } catch (const py::cast_error& e) {
      TORCH_CHECK(false, "making the CUDA side: the creator returned no c10d Backend (", e.what(), ")");
    }
  };
}

c10::intrusive_ptr<c10d::Backend> createTunedBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     const std::chrono::duration<float>& timeout,
                                                     const py::object& onNcclCreated, const py::object& glooFactory,
                                                     bool enableReconfigure, int64_t stableRank,
                                                     const py::object& ncclFactory) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  auto hook = ncclCreatedHook(onNcclCreated);
  tunedist::engine::hier::GlooFactory factory = wrapGlooFactory(glooFactory);
  tunedist::cuda::NcclSide::Factory cudaFactory = wrapNcclFactory(ncclFactory);
  py::gil_scoped_release release;
  return tunedist::TunedBackend::create(store, rank, size, ms, std::move(hook), std::move(factory), enableReconfigure,
                                        stableRank, std::move(cudaFactory));
}

tunedist::TunedBackend& tunedBackend(const c10::intrusive_ptr<c10d::Backend>& backend, const char* what) {
  auto* tuned = dynamic_cast<tunedist::TunedBackend*>(backend.get());
  TORCH_CHECK(tuned != nullptr, what, ": not a tunedist backend");
  return *tuned;
}

// Copy bandwidth (bytes copied per second, GB/s with 1 GB = 1e9 B) of one run of the engine's copy routine from
// `src` into `dst`: two contiguous CPU tensors of the same size, allocated and touched by the caller. The benchmark
// calls it on every rank right after a barrier, so the ranks copy at once and share the memory system as the
// collectives do; allocation and first touch stay outside the timed copy (and outside the synchronised part).
double copyGbps(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu() && dst.is_contiguous() && src.is_contiguous(),
              "copy_gbps: needs contiguous CPU tensors");
  TORCH_CHECK(dst.nbytes() == src.nbytes() && dst.nbytes() > 0, "copy_gbps: dst has ", dst.nbytes(), " bytes and src ",
              src.nbytes(), "; they must be the same, non-zero size");
  TORCH_CHECK(!dst.is_alias_of(src), "copy_gbps: dst and src share storage");
  const size_t bytes = dst.nbytes();
  py::gil_scoped_release release;
  auto t0 = std::chrono::steady_clock::now();
  tunedist::kernels::copyBytes(dst.data_ptr(), src.data_ptr(), bytes);
  auto t1 = std::chrono::steady_clock::now();
  return double(bytes) / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}

// Medians (us) of the engine's kernels on `bytes` of float32, for the per-call budget
// (benchmarks/bench_call_budget.py): copy into a separate buffer (as into a slot), reduce (SUM) of `nsrc` distinct
// sources into an output (the one-shot all-reduce's work), and the one-source reduce in place that a world-size-1
// all-reduce runs.
py::dict measureKernelsUs(size_t bytes, int nsrc, int reps) {
  TORCH_CHECK(bytes >= 4 && nsrc >= 1 && reps >= 1, "measure_kernels_us: need bytes >= 4, nsrc >= 1, reps >= 1");
  const size_t count = bytes / 4;
  std::vector<std::vector<float>> srcs(size_t(nsrc), std::vector<float>(count, 1.0f));
  std::vector<float> out(count, 0.0f);
  std::vector<const void*> ptrs;
  for (auto& s : srcs) {
    ptrs.push_back(s.data());
  }
  tunedist::kernels::ReduceArgs sum;
  sum.dtype = tunedist::core::DType::kFloat32;
  sum.op = tunedist::core::RedOp::kSum;
  auto median = [reps](auto&& fn) {
    std::vector<double> us;
    fn();
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  double copyUs = 0, reduceUs = 0, selfUs = 0;
  {
    py::gil_scoped_release release;
    // all_reduce copies into its slot (and, two-shot, out of a peer's) with plain cached stores: time that copy,
    // not the streaming one, which at 16 KiB already writes to memory (~5x the time of a cached 16 KiB copy here).
    copyUs = median([&] { tunedist::kernels::copyBytesCached(out.data(), srcs[0].data(), count * 4); });
    reduceUs = median([&] { tunedist::kernels::reduce(sum, out.data(), ptrs.data(), nsrc, count); });
    const void* self = out.data();
    selfUs = median([&] { tunedist::kernels::reduce(sum, out.data(), &self, 1, count); });
  }
  py::dict d;
  d["copy_us"] = copyUs;
  d["reduce_us"] = reduceUs;
  d["self_copy_us"] = selfUs;
  return d;
}

// The holder of tunedist._C.TunedBackend objects (as torch's ProcessGroupGloo has): it drops its reference with the
// GIL released. Python code drops a backend (destroy_process_group) holding the GIL; the last reference ends the
// backend, which joins threads (our worker, the gloo groups' threads between hosts) that may need the GIL to release
// a Python-owned tensor they held last. Joining them under the GIL deadlocked.
template <typename T>
class NoGilIntrusivePtr {
 public:
  NoGilIntrusivePtr() = default;
  explicit NoGilIntrusivePtr(T* p) : ptr_(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(p)) {}
  NoGilIntrusivePtr(const NoGilIntrusivePtr&) = default;
  NoGilIntrusivePtr& operator=(const NoGilIntrusivePtr&) = default;
  ~NoGilIntrusivePtr() {
    if (ptr_ && PyGILState_Check() != 0) {
      py::gil_scoped_release release;
      ptr_.reset();
    }
  }
  T* get() const { return ptr_.get(); }

 private:
  c10::intrusive_ptr<T> ptr_;  // the only member: pybind reads this holder as a c10::intrusive_ptr<c10d::Backend>
};
static_assert(sizeof(NoGilIntrusivePtr<tunedist::TunedBackend>) == sizeof(c10::intrusive_ptr<c10d::Backend>),
              "pybind casts the holder of a TunedBackend to torch's holder of a Backend");

}  // namespace
}  // namespace tunedist::python

PYBIND11_DECLARE_HOLDER_TYPE(T, tunedist::python::NoGilIntrusivePtr<T>, true);

namespace tunedist::python {
namespace {

void bindModule(py::module& m) {
  m.doc() = "tunedist native module";
  m.def("create_backend", &createTunedBackend, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::arg("on_nccl_created") = py::none(), py::arg("gloo_factory") = py::none(),
        py::arg("enable_reconfigure") = false, py::arg("stable_rank") = -1, py::arg("nccl_factory") = py::none(),
        "Creates the `tuned` c10d backend (the creator registered with torch.distributed).");
  // The Python type of the backend objects torch hands out (pg._get_backend(...)). torch's new_group, on a parent
  // with a bound device whose backend supports splitting, has the ranks left out of the new group call
  // perform_nocolor_split on the parent backend (an NCCL notion: every rank of the parent joins ncclCommSplit).
  // A `tuned` group is created by its members alone, so the ranks outside it have nothing to do.
  py::class_<tunedist::TunedBackend, c10d::Backend, NoGilIntrusivePtr<tunedist::TunedBackend>>(m, "TunedBackend")
      .def(
          "perform_nocolor_split", [](tunedist::TunedBackend&, const py::object&) {}, py::arg("device"),
          "Nothing to do: ranks outside a new `tuned` group take no part in creating it.")
      // torch 2.15's split_group, with TorchComms on (the torchcomms package importable and the switch set),
      // appends the new group's get_comm() to the TorchComms communicators that destroy_process_group finalizes, as
      // if every backend were TorchComms' wrapper. A `tuned` group is its own communicator: get_comm() is the
      // backend, and finalize() shuts it down, as destroy_process_group does next anyway.
      .def("get_comm", [](py::object self) { return self; })
      .def(
          "finalize",
          [](tunedist::TunedBackend& backend) {
            py::gil_scoped_release release;
            backend.shutdown();
          },
          "Shuts the group down (TorchComms' name for it).");
  m.def("torch_version_built", [] { return std::string(TUNEDIST_TORCH_BUILT_VERSION); });
  m.def("version", &tunedist::versionString);
  m.def("simd_level",
        [] { return std::string(tunedist::kernels::simdLevelName(tunedist::kernels::activeSimdLevel())); });
  m.def("best_simd_level",
        [] { return std::string(tunedist::kernels::simdLevelName(tunedist::kernels::detectSimdLevel())); });
  // Tests pin a level to compare kernels across levels in one process; throws if the CPU lacks it.
  m.def("force_simd_level", [](const std::string& name) {
    for (auto level : {tunedist::kernels::SimdLevel::kScalar, tunedist::kernels::SimdLevel::kAvx2,
                       tunedist::kernels::SimdLevel::kAvx512}) {
      if (name == tunedist::kernels::simdLevelName(level)) return tunedist::kernels::forceSimdLevel(level);
    }
    throw std::invalid_argument("tunedist._C.force_simd_level: unknown SIMD level '" + name +
                                "' (expected scalar, avx2 or avx512)");
  });
  m.def("reset_simd_level", &tunedist::kernels::resetSimdLevel);
  m.def("copy_gbps", &copyGbps, py::arg("dst"), py::arg("src"));
  m.def("measure_kernels_us", &measureKernelsUs, py::arg("nbytes"), py::arg("nsrc"), py::arg("reps"));
  m.def(
      "reserved_shm_bytes",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        return tunedBackend(backend, "reserved_shm_bytes").cpu().reservedShmBytes();
      },
      py::arg("backend"));
  m.def(
      "is_symmetric",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const at::Tensor& t) {
        return tunedBackend(backend, "is_symmetric").cpu().isSymmetric(t);
      },
      py::arg("backend"), py::arg("tensor"));
  m.def("register_symmetric_memory_allocator", &tunedist::cpu::symm_mem::registerAllocator,
        "Registers tunedist's CPU allocator with torch.distributed._symmetric_memory (tuned groups' heaps).");
  m.def(
      "symmetric_heap_stats",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        const auto& cpu = tunedBackend(backend, "symmetric_heap_stats").cpu();
        const auto s = cpu.heapStats();
        py::dict d;
        d["reserved_bytes"] = s.reservedBytes;
        d["in_use_bytes"] = s.inUseBytes;
        d["peak_in_use_bytes"] = s.peakInUseBytes;
        d["chunks"] = s.chunks;
        d["allocations"] = s.allocations;
        d["chunk_creations"] = s.chunkCreations;
        d["zero_copy_ops"] = s.zeroCopyOps;
        d["copy_restarts"] = s.copyRestarts;
        d["min_bytes"] = cpu.symmetricMinBytes();
        d["zero_copy_choice"] = cpu.options().shm.symmetricMinBytes ? "forced" : "measured";
        // Each size class whose path the group has measured (shm/zero_copy/path_chooser.h): the path it keeps and
        // this rank's medians of its last window, ns per byte per path.
        py::list paths;
        const tunedist::shm::ShmComm* comm = cpu.hostComm();
        if (comm != nullptr && comm->zeroCopy() != nullptr) {
          using tunedist::shm::zero_copy::ZeroCopyCollectives;
          using tunedist::shm::zero_copy::Path;
          using tunedist::shm::zero_copy::PathChooser;
          for (ZeroCopyCollectives::Op op : ZeroCopyCollectives::kOps) {
            const PathChooser& c = comm->zeroCopy()->chooser(op);
            for (int cls = 0; cls < PathChooser::kClasses; ++cls) {
              if (c.windows(cls) == 0) {
                continue;
              }
              py::dict r;
              r["op"] = ZeroCopyCollectives::opName(op);
              r["bytes_from"] = PathChooser::classMinBytes(cls);
              r["path"] = tunedist::shm::zero_copy::pathName(c.path(cls));
              r["windows"] = c.windows(cls);
              py::dict ns;
              for (int k = 0; k < tunedist::shm::zero_copy::kPaths; ++k) {
                if (c.allowed() & (1u << k)) {
                  ns[tunedist::shm::zero_copy::pathName(Path(k))] = c.lastMedian(cls, Path(k));
                }
              }
              r["ns_per_byte"] = ns;
              paths.append(r);
            }
          }
        }
        d["paths"] = paths;
        return d;
      },
      py::arg("backend"));
  m.def(
      "slot_store_stats",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        const tunedist::shm::ShmComm* comm = tunedBackend(backend, "slot_store_stats").cpu().hostComm();
        py::dict d;
        if (comm == nullptr) {
          return d;  // no operation has run yet
        }
        using tunedist::shm::RoundStoreChooser;
        using tunedist::shm::StorePolicy;
        d["mode"] = tunedist::core::slotStoresName(comm->options().slotStores);
        py::list rounds;
        const std::pair<StorePolicy::Family, const char*> families[] = {
            {StorePolicy::kOneShotAllreduce, "all_reduce"},
            {StorePolicy::kTwoShotAllreduce, "all_reduce_two_shot"},
            {StorePolicy::kAllgather, "all_gather"},
            {StorePolicy::kReduceScatter, "reduce_scatter"},
            {StorePolicy::kBroadcast, "broadcast"},
            {StorePolicy::kReduce, "reduce"},
            {StorePolicy::kGather, "gather"},
            {StorePolicy::kScatter, "scatter"},
            {StorePolicy::kAlltoall, "all_to_all"}};
        for (const auto& [family, name] : families) {
          const RoundStoreChooser& c = comm->roundStoreChooser(family);
          for (int cls = 0; cls < RoundStoreChooser::kClasses; ++cls) {
            if (c.windows(cls) == 0) {
              continue;
            }
            py::dict r;
            r["op"] = name;
            r["slot_bytes_from"] = RoundStoreChooser::kMinBytes << cls;
            r["streaming"] = c.streaming(cls);
            r["windows"] = c.windows(cls);
            r["cached_ns_per_byte"] = c.lastCachedNsPerByte(cls);
            r["streaming_ns_per_byte"] = c.lastStreamingNsPerByte(cls);
            rounds.append(r);
          }
        }
        d["round_chooser"] = rounds;
        return d;
      },
      py::arg("backend"));
  m.def("nccl_build_info", [] {
    auto info = tunedist::cuda::ncclBuildInfo();
    py::dict d;
    d["compiled_in"] = info.compiledIn;
    d["header_version"] = info.headerVersion;
    d["torch_nccl_version"] = info.torchVersion;
    return d;
  });
  m.def(
      "nccl_side",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) -> py::object {
        auto nccl = tunedBackend(backend, "nccl_side").ncclBackend();
        return nccl ? py::cast(nccl) : py::none();
      },
      py::arg("backend"),
      "The backend behind a `tuned` group's CUDA calls (torch's \"nccl\"), or None before it is made.");
  tunedist::python::bindHooks(m);
  m.def(
      "host_layout",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto& tuned = tunedBackend(backend, "host_layout");
        py::gil_scoped_release release;
        auto& cpu = tuned.cpu();
        return cpu.hostLayout(std::chrono::steady_clock::now() + cpu.effectiveTimeout(c10d::kUnsetTimeout)).hosts;
      },
      py::arg("backend"), "The group's hosts as lists of group ranks (found at the first operation).");
  m.def(
      "cross_host_stats",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto s = tunedBackend(backend, "cross_host_stats").cpu().crossHostStats();
        py::dict d;
        d["data_bytes"] = s.dataBytes;
        d["meta_bytes"] = s.metaBytes;
        d["gloo_ops"] = s.glooOps;
        return d;
      },
      py::arg("backend"), "Bytes this rank handed to gloo between hosts (all zero on one host).");
}

}  // namespace
}  // namespace tunedist::python

PYBIND11_MODULE(_C, m) { tunedist::python::bindModule(m); }
