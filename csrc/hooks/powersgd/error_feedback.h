// PowerSGD's error feedback (internal header; error_feedback.cpp): ErrorFeedback for powerSGD_hook, region by
// region, and addErrorFeedback, the whole-buffer step 1 that batched_powerSGD_hook (and ErrorFeedback off its
// per-region path) uses.
#pragma once

#include <vector>

#include "hooks/common.h"

namespace tunedist::hooks {

// Error feedback, step 1 (caller holds the state's mutex): input += error (creating the error the first time);
// the error buffer then holds a copy of input, so step 2 (error -= decompressed input) leaves copy - result.
void addErrorFeedback(PowerSgdState& state, int64_t bucketIndex, at::Tensor& input, const char* op);

// powerSGD_hook's error feedback for one bucket step, in two steps: 1. each region += its error; 2. once the
// region's decompressed values are known, error = the region's error-fed values - its new values, region = new
// values. Regions are `regions`, views of the bucket that tile it (GradBucket's gradients).
// Per region (contiguous CPU float32, perRegion()): step 1 is applyPending(region), or fused with the region's
// first use (pendingSlice(region): the error a kernel adds while reading the region, e.g. P = (M + E) Q); step 2 is
// replace() or writePQt(..., sliceFor(region)), one pass each. Every region must get step 1 exactly once, before
// anything reads its values. Elsewhere (other devices or dtypes, regions that do not tile the bucket) the
// constructor does step 1 for the whole bucket and keeps a copy of it, finish() does step 2, and the per-region
// calls only write values. Without use_error_feedback nothing is added and values are only written.
class ErrorFeedback {
 public:
  // Called with the state's lock held.
  ErrorFeedback(PowerSgdState& state, int64_t index, at::Tensor input, const std::vector<at::Tensor>& regions,
                const char* op);
  // Whether the error is handled region by region (the bucket and its regions are contiguous CPU float32).
  bool perRegion() const { return perRegion_; }
  // The part of the error behind `region`; undefined unless perRegion().
  at::Tensor sliceFor(const at::Tensor& region) const;
  // Step 1 for `region`, if it is still to be done (per region and the bucket had an error from a previous step).
  void applyPending(const at::Tensor& region) const;
  // The error the caller must add to `region` itself (step 1, fused); undefined if there is none.
  at::Tensor pendingSlice(const at::Tensor& region) const;
  // region = values (values: region's size), updating the error per region.
  void replace(at::Tensor& region, const at::Tensor& values);
  // error = copy - input, unless done per region.
  void finish();

 private:
  at::Tensor input_;
  at::Tensor error_;  // undefined without error feedback
  bool perRegion_ = false;
  bool pending_ = false;  // per region: step 1 is left to the caller, region by region
};

}  // namespace tunedist::hooks
