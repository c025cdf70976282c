// PowerSGD's error feedback (torch's use_error_feedback), in as few passes over memory as torch's arithmetic allows.
// torch: input += error; copy = input; (compress, decompress into input); error = copy - input.
// powerSGD_hook on CPU float32 (ErrorFeedback, per region): nothing copied; each region += its error, in the pass
// that first reads it where a kernel can (P = (M + E) Q: addErrorAndMultiplyMQ), and is then replaced by its
// decompressed values in one pass that also writes error = region's old (error-fed) values - new values (a
// compressed matrix's values are computed in that same pass: writePQt).
// Elsewhere (and in batched_powerSGD_hook): add and copy in one pass (addErrorFeedback; on CUDA a fused kernel of
// hooks/cuda when built with it), subtract the whole buffer at the end. The error arithmetic is torch's (a + b, a - b).
#include "hooks/powersgd/error_feedback.h"

#include <ATen/Parallel.h>

#include "hooks/cuda/cuda_kernels.h"

namespace tunedist::hooks {
namespace {

// Elements per parallel_for chunk of the fused loops.
constexpr int64_t kGrain = int64_t{1} << 16;

// input += error, then error = input: one pass over both for contiguous CPU float32, ATen's add_ and copy_ otherwise.
void addAndRemember(at::Tensor& input, at::Tensor& error) {
  if (cuda::addAndRemember(input, error)) return;  // CUDA float32: one fused pass (hooks/cuda)
  if (!cpuFloat(input) || !cpuFloat(error)) {
    input.add_(error);
    error.copy_(input);
    return;
  }
  float* in = input.data_ptr<float>();
  float* err = error.data_ptr<float>();
  at::parallel_for(0, input.numel(), kGrain, [&](int64_t begin, int64_t end) {
    float* __restrict a = in + begin;
    float* __restrict b = err + begin;
    for (int64_t i = 0; i < end - begin; ++i) {
      const float sum = a[i] + b[i];
      a[i] = sum;
      b[i] = sum;
    }
  });
}

// Whether `t` is a contiguous view of `buffer`'s storage, inside it.
bool viewsInto(const at::Tensor& t, const at::Tensor& buffer) {
  const int64_t offset = t.storage_offset() - buffer.storage_offset();
  return t.is_contiguous() && t.is_alias_of(buffer) && offset >= 0 && offset + t.numel() <= buffer.numel();
}

void checkErrorShape(const at::Tensor& error, const at::Tensor& input, int64_t bucketIndex, const char* op) {
  TORCH_CHECK(error.numel() == input.numel() && error.scalar_type() == input.scalar_type(), op,
              ": the error-feedback tensor of bucket ", bucketIndex, " has ", error.numel(), " elements of ",
              error.scalar_type(), " but the bucket has ", input.numel(), " of ", input.scalar_type(),
              ". The buckets changed since the state was saved (another model, bucket_cap_mb or parameter "
              "order?); start PowerSGD after DDP's bucket rebuild (start_powerSGD_iter >= 2) and restore the "
              "state into the same model configuration.");
}

}  // namespace

void addErrorFeedback(PowerSgdState& state, int64_t bucketIndex, at::Tensor& input, const char* op) {
  auto it = state.errorDict.find(bucketIndex);
  if (it == state.errorDict.end()) {
    state.errorDict.emplace(bucketIndex, input.clone(at::MemoryFormat::Contiguous));
    return;
  }
  checkErrorShape(it->second, input, bucketIndex, op);
  addAndRemember(input, it->second);
}

ErrorFeedback::ErrorFeedback(PowerSgdState& state, int64_t index, at::Tensor input,
                             const std::vector<at::Tensor>& regions, const char* op)
    : input_(std::move(input)) {
  if (!state.options.useErrorFeedback) return;
  int64_t covered = 0;
  bool views = cpuFloat(input_);
  for (const auto& r : regions) {
    views = views && viewsInto(r, input_) && cpuFloat(r);
    covered += r.numel();
  }
  // Regions that tile the buffer (GradBucket's gradients do): each element is replaced exactly once.
  perRegion_ = views && covered == input_.numel();
  if (!perRegion_) {
    addErrorFeedback(state, index, input_, op);
    error_ = state.errorDict[index];
    return;
  }
  auto it = state.errorDict.find(index);
  if (it == state.errorDict.end()) {
    error_ = at::empty_like(input_);  // written in full by replace()
    state.errorDict.emplace(index, error_);
    return;
  }
  checkErrorShape(it->second, input_, index, op);
  error_ = it->second;
  TORCH_CHECK(cpuFloat(error_), op, ": the error-feedback tensor of bucket ", index,
              " must be a contiguous CPU "
              "float32 tensor like the bucket");
  pending_ = true;
}

at::Tensor ErrorFeedback::pendingSlice(const at::Tensor& region) const {
  return pending_ ? sliceFor(region) : at::Tensor();
}

void ErrorFeedback::applyPending(const at::Tensor& region) const {
  if (!pending_ || region.numel() == 0) return;
  at::Tensor slice = sliceFor(region);
  float* __restrict g = region.data_ptr<float>();
  const float* __restrict e = slice.data_ptr<float>();
  at::parallel_for(0, region.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) g[i] += e[i];
  });
}

at::Tensor ErrorFeedback::sliceFor(const at::Tensor& region) const {
  if (!perRegion_) return {};
  return error_.narrow(0, region.storage_offset() - input_.storage_offset(), region.numel());
}

void ErrorFeedback::replace(at::Tensor& region, const at::Tensor& values) {
  at::Tensor slice = sliceFor(region);
  if (!slice.defined() || !cpuFloat(values) || values.numel() != region.numel()) {
    TORCH_CHECK(!slice.defined(),
                "tunedist.hooks.ErrorFeedback: replacement values must be contiguous CPU float32 "
                "of the region's size");
    region.copy_(values.view_as(region));
    return;
  }
  float* __restrict e = slice.data_ptr<float>();
  float* __restrict g = region.data_ptr<float>();
  const float* __restrict v = values.data_ptr<float>();
  at::parallel_for(0, region.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      e[i] = g[i] - v[i];  // torch: error = error-fed input - decompressed input
      g[i] = v[i];
    }
  });
}

void ErrorFeedback::finish() {
  if (error_.defined() && !perRegion_) error_.sub_(input_);
}

}  // namespace tunedist::hooks
