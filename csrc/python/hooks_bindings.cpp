// Python bindings of the DDP communication hooks (tunedist._C._hooks): the functions the drop-in modules call per
// bucket, the native installation on a DDP Reducer, the PowerSGD state, and the kernels and generator for tests.
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <array>

#include "python/hooks_bindings.h"
#include "tunedist/hooks/hooks.h"

namespace py = pybind11;

namespace tunedist::python {
namespace {

using State = hooks::PowerSgdState;
using StatePtr = std::shared_ptr<State>;
using PyFuture = std::shared_ptr<torch::jit::PythonFutureWrapper>;

PyFuture wrap(hooks::FuturePtr fut) { return std::make_shared<torch::jit::PythonFutureWrapper>(std::move(fut)); }

at::ScalarType lowPrecision(const std::string& name, const char* op) {
  if (name == "fp16") return at::kHalf;
  TORCH_CHECK_VALUE(name == "bf16", op, ": unknown low precision '", name, "' (expected 'fp16' or 'bf16')");
  return at::kBFloat16;
}

// Builds the C++ hook for `kind` and installs it on the reducer (Reducer::register_comm_hook refuses a second).
void registerOnReducer(c10d::Reducer& reducer, const std::string& kind, const hooks::GroupPtr& group,
                       const StatePtr& state, const std::string& wrapper) {
  std::unique_ptr<c10d::CommHookInterface> hook;
  if (kind == "allreduce") {
    hook = hooks::makeAllreduceHook(group);
  } else if (kind == "fp16" || kind == "bf16") {
    hook = hooks::makeCompressHook(group, lowPrecision(kind, "tunedist.hooks.register"));
  } else if (kind == "powersgd" || kind == "batched_powersgd") {
    hook = hooks::makePowerSgdHook(group, state, kind == "batched_powersgd");
  } else {
    TORCH_CHECK_VALUE(false, "tunedist.hooks.register: unknown hook '", kind, "'");
  }
  if (!wrapper.empty())
    hook = hooks::makeLowPrecisionWrapper(std::move(hook), lowPrecision(wrapper, "tunedist.hooks.register"));
  reducer.register_comm_hook(std::move(hook));
}

template <typename T>
void bindField(py::class_<State, StatePtr>& cls, const char* name, T State::*member) {
  cls.def_property(
      name,
      [member](State& s) {
        std::lock_guard<std::mutex> g(s.mutex);
        return s.*member;
      },
      [member](State& s, T v) {
        std::lock_guard<std::mutex> g(s.mutex);
        s.*member = v;
      });
}

template <typename Field>
void bindOption(py::class_<State, StatePtr>& cls, const char* name, Field hooks::PowerSgdOptions::*field) {
  cls.def_property(
      name,
      [field](State& s) {
        std::lock_guard<std::mutex> g(s.mutex);
        return s.options.*field;
      },
      [field](State& s, Field v) {
        std::lock_guard<std::mutex> g(s.mutex);
        s.options.*field = v;
      });
}

void bindDict(py::class_<State, StatePtr>& cls, const char* name, std::map<int64_t, at::Tensor> State::*dict) {
  cls.def_property(
      name,
      [dict](State& s) {
        std::lock_guard<std::mutex> g(s.mutex);
        return s.*dict;
      },
      [dict](State& s, std::map<int64_t, at::Tensor> v) {
        std::lock_guard<std::mutex> g(s.mutex);
        s.*dict = std::move(v);
      });
}

void bindState(py::module& m) {
  py::class_<State, StatePtr> cls(m, "PowerSGDStateCpp");
  cls.def(py::init([](int64_t rank, int64_t startIter, double minRate, bool errorFeedback, bool warmStart,
                      double epsilon, uint32_t seed, int64_t statsFrequency, bool batchSameShape) {
            hooks::PowerSgdOptions o{rank,    startIter, minRate,        errorFeedback, warmStart,
                                     epsilon, seed,      statsFrequency, batchSameShape};
            return std::make_shared<State>(o);
          }),
          py::arg("matrix_approximation_rank"), py::arg("start_powerSGD_iter"), py::arg("min_compression_rate"),
          py::arg("use_error_feedback"), py::arg("warm_start"), py::arg("orthogonalization_epsilon"),
          py::arg("random_seed"), py::arg("compression_stats_logging_frequency"),
          py::arg("batch_tensors_with_same_shape"));
  bindOption(cls, "matrix_approximation_rank", &hooks::PowerSgdOptions::matrixApproximationRank);
  bindOption(cls, "start_powerSGD_iter", &hooks::PowerSgdOptions::startPowerSgdIter);
  bindOption(cls, "min_compression_rate", &hooks::PowerSgdOptions::minCompressionRate);
  bindOption(cls, "use_error_feedback", &hooks::PowerSgdOptions::useErrorFeedback);
  bindOption(cls, "warm_start", &hooks::PowerSgdOptions::warmStart);
  bindOption(cls, "orthogonalization_epsilon", &hooks::PowerSgdOptions::orthogonalizationEpsilon);
  bindOption(cls, "compression_stats_logging_frequency", &hooks::PowerSgdOptions::compressionStatsLoggingFrequency);
  bindOption(cls, "batch_tensors_with_same_shape", &hooks::PowerSgdOptions::batchTensorsWithSameShape);
  bindField(cls, "iter", &State::iter);
  bindField(cls, "total_numel_before_compression", &State::totalNumelBeforeCompression);
  bindField(cls, "total_numel_after_compression", &State::totalNumelAfterCompression);
  bindField(cls, "next_stats_report", &State::nextStatsReport);
  bindDict(cls, "error_dict", &State::errorDict);
  bindDict(cls, "p_memory_dict", &State::pMemoryDict);
  bindDict(cls, "q_memory_dict", &State::qMemoryDict);
  cls.def_property(
      "rng_state",
      [](State& s) {
        std::lock_guard<std::mutex> g(s.mutex);
        return std::make_pair(std::vector<uint32_t>(s.rng.key().begin(), s.rng.key().end()), s.rng.pos());
      },
      [](State& s, const std::pair<std::vector<uint32_t>, int>& st) {
        TORCH_CHECK_VALUE(st.first.size() == hooks::NumpyRandomState::kStateWords,
                          "PowerSGDState: the random state needs 624 key words, got ", st.first.size());
        std::array<uint32_t, hooks::NumpyRandomState::kStateWords> key{};
        std::copy(st.first.begin(), st.first.end(), key.begin());
        std::lock_guard<std::mutex> g(s.mutex);
        s.rng.setState(key, st.second);
      });
  cls.def("compression_stats", [](State& s) {
    std::lock_guard<std::mutex> g(s.mutex);
    return s.compressionStats();
  });
  cls.def("workspace_bytes", &State::workspaceBytes);
}

void bindRandom(py::module& m) {
  py::class_<hooks::NumpyRandomState>(m, "NumpyRandomState")
      .def(py::init<uint32_t>(), py::arg("seed") = 0)
      .def("seed", &hooks::NumpyRandomState::seed_)
      .def("next_uint32", &hooks::NumpyRandomState::nextUint32)
      .def("randint", &hooks::NumpyRandomState::randint, py::arg("high"));
}

}  // namespace
}  // namespace tunedist::python

void tunedist::python::bindHooks(py::module& parent) {
  using namespace tunedist::hooks;
  py::module m = parent.def_submodule("_hooks", "tunedist's DDP communication hooks (C++)");
  bindState(m);
  bindRandom(m);
  const auto noGil = py::call_guard<py::gil_scoped_release>();
  m.def(
      "run_allreduce",
      [](const hooks::GroupPtr& g, c10d::GradBucket& b) { return wrap(hooks::allreduceMean(g, b.getBufferRef())); },
      noGil);
  m.def(
      "run_compress",
      [](const hooks::GroupPtr& g, c10d::GradBucket& b, const std::string& precision) {
        return wrap(hooks::runCompressHook(g, b, lowPrecision(precision, "tunedist.hooks.default"), nullptr));
      },
      noGil);
  m.def(
      "run_powersgd",
      [](const StatePtr& s, const hooks::GroupPtr& g, c10d::GradBucket& b) {
        return wrap(hooks::runPowerSgd(s, g, b));
      },
      noGil);
  m.def(
      "run_batched_powersgd",
      [](const StatePtr& s, const hooks::GroupPtr& g, c10d::GradBucket& b) {
        return wrap(hooks::runBatchedPowerSgd(s, g, b));
      },
      noGil);
  m.def("register", &registerOnReducer, py::arg("reducer"), py::arg("kind"), py::arg("group"), py::arg("state"),
        py::arg("wrapper"));
  m.def("cuda_kernels_built", &cudaKernelsBuilt, "Whether this build has the hooks' CUDA kernels.");
  m.def("compress_into", [](at::Tensor dst, const at::Tensor& src, int64_t d) { hooks::compressInto(dst, src, d); });
  m.def("decompress_into", [](at::Tensor dst, const at::Tensor& src) { hooks::decompressInto(dst, src); });
  m.def("compress_in_place", [](at::Tensor buffer, const std::string& precision, int64_t d) {
    return hooks::compressInPlace(buffer, lowPrecision(precision, "tunedist.hooks.compress_in_place"), d);
  });
  m.def("decompress_in_place",
        [](at::Tensor buffer, const at::Tensor& view) { hooks::decompressInPlace(buffer, view, view); });
  m.def("orthogonalize", [](at::Tensor t, double eps) { hooks::orthogonalize(t, eps); });
  m.def(
      "multiply_mq", [](const at::Tensor& mat, const at::Tensor& q, at::Tensor p) { hooks::multiplyMQ(mat, q, p); },
      py::arg("matrix"), py::arg("q"), py::arg("p"), "p = matrix @ q, in place (PowerSGD's P).");
  m.def(
      "multiply_mtp", [](const at::Tensor& mat, const at::Tensor& p, at::Tensor q) { hooks::multiplyMtP(mat, p, q); },
      py::arg("matrix"), py::arg("p"), py::arg("q"), "q = matrix.T @ p, in place (PowerSGD's Q).");
  m.def(
      "write_pqt",
      [](at::Tensor out, const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& error) {
        hooks::writePQt(out, p, q, error.value_or(at::Tensor()));
      },
      py::arg("out"), py::arg("p"), py::arg("q"), py::arg("error") = py::none(),
      "out = p @ q.T in place; with `error`, error = out's old values - the new ones, in the same pass.");
}
