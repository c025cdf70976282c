// PowerSGD's error feedback (torch's use_error_feedback), in as few passes over memory as torch's arithmetic allows:
// step 1 adds the error to the bucket and remembers the sum in one pass (addErrorFeedback); step 2 subtracts each
// decompressed region from the remembered sum right after the region is written, while it is still in cache
// (ErrorFeedbackUpdate), and a rank-1 region is written and subtracted in one pass (writeRankOne). Every float
// operation is the one torch's hook does (a + b, a - b, p * q), so the results are the same bits.
#include <ATen/Parallel.h>

#include "hooks/hook_common.h"

namespace tunedist::hooks {
namespace {

// Elements per parallel_for chunk of the fused loops.
constexpr int64_t kGrain = int64_t{1} << 16;

bool cpuFloat(const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(); }

// input += error, then error = input: one pass over both for contiguous CPU float32, ATen's add_ and copy_ otherwise.
void addAndRemember(at::Tensor& input, at::Tensor& error) {
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

}  // namespace

void addErrorFeedback(PowerSgdState& state, int64_t bucketIndex, at::Tensor& input, const char* op) {
  auto it = state.errorDict.find(bucketIndex);
  if (it == state.errorDict.end()) {
    state.errorDict.emplace(bucketIndex, input.clone(at::MemoryFormat::Contiguous));
    return;
  }
  TORCH_CHECK(it->second.numel() == input.numel() && it->second.scalar_type() == input.scalar_type(), op,
              ": the error-feedback tensor of bucket ", bucketIndex, " has ", it->second.numel(), " elements of ",
              it->second.scalar_type(), " but the bucket has ", input.numel(), " of ", input.scalar_type(),
              ". The buckets changed since the state was saved (another model, bucket_cap_mb or parameter "
              "order?); start PowerSGD after DDP's bucket rebuild (start_powerSGD_iter >= 2) and restore the "
              "state into the same model configuration.");
  addAndRemember(input, it->second);
}

ErrorFeedbackUpdate::ErrorFeedbackUpdate(at::Tensor error, at::Tensor input,
                                         const std::vector<at::Tensor>& regions)
    : error_(std::move(error)), input_(std::move(input)) {
  if (!error_.defined()) return;
  int64_t covered = 0;
  bool views = error_.is_contiguous() && error_.numel() == input_.numel();
  for (const auto& r : regions) {
    views = views && viewsInto(r, input_);
    covered += r.numel();
  }
  // Regions that tile the buffer (GradBucket's gradients do): no element is subtracted twice or missed.
  perRegion_ = views && covered == input_.numel();
}

at::Tensor ErrorFeedbackUpdate::sliceFor(const at::Tensor& region) const {
  if (!perRegion_) return {};
  return error_.narrow(0, region.storage_offset() - input_.storage_offset(), region.numel());
}

void ErrorFeedbackUpdate::subtract(const at::Tensor& region) {
  at::Tensor slice = sliceFor(region);
  if (!slice.defined()) return;
  if (!cpuFloat(slice) || !cpuFloat(region)) {
    slice.sub_(region.reshape({-1}));
    return;
  }
  float* __restrict e = slice.data_ptr<float>();
  const float* __restrict v = region.data_ptr<float>();
  at::parallel_for(0, region.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) e[i] -= v[i];
  });
}

void ErrorFeedbackUpdate::finish() {
  if (error_.defined() && !perRegion_) error_.sub_(input_);
}

bool canWriteRankOne(const at::Tensor& out, const at::Tensor& p, const at::Tensor& q) {
  return out.dim() == 2 && cpuFloat(out) && cpuFloat(p) && cpuFloat(q) && p.numel() == out.size(0) &&
         q.numel() == out.size(1);
}

void writeRankOne(at::Tensor& out, const at::Tensor& p, const at::Tensor& q, const at::Tensor& errorSlice) {
  TORCH_CHECK(canWriteRankOne(out, p, q) && (!errorSlice.defined() || (cpuFloat(errorSlice) &&
              errorSlice.numel() == out.numel())), "tunedist.hooks.writeRankOne: needs contiguous CPU float32 "
              "tensors out (n, m), p (n), q (m) and an error slice of n*m elements");
  const int64_t rows = out.size(0), cols = out.size(1);
  float* __restrict o = out.data_ptr<float>();
  float* __restrict e = errorSlice.defined() ? errorSlice.data_ptr<float>() : nullptr;
  const float* __restrict pv = p.data_ptr<float>();
  const float* __restrict qv = q.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* __restrict row = o + i * cols;
      const float pi = pv[i];
      if (e == nullptr) {
        for (int64_t j = 0; j < cols; ++j) row[j] = pi * qv[j];
        continue;
      }
      float* __restrict erow = e + i * cols;
      for (int64_t j = 0; j < cols; ++j) {
        const float v = pi * qv[j];  // BLAS's rank-1 product: one rounding, as here
        row[j] = v;
        erow[j] -= v;
      }
    }
  });
}

}  // namespace tunedist::hooks
