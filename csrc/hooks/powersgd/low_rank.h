// PowerSGD's matrix products (low_rank.cpp). multiplyMQ, multiplyMtP and writePQt are public
// (tunedist/hooks/kernels.h); this internal header adds the product fused with error feedback's step 1.
#pragma once

#include <ATen/ATen.h>

namespace tunedist::hooks {

// P = (M + E) Q for a matrix M with the error E still to add (ErrorFeedback::pendingSlice), M += E in the same
// pass on our kernels; on the ATen path M += E, then mm.
void addErrorAndMultiplyMQ(at::Tensor& matrix, const at::Tensor& error, const at::Tensor& q, at::Tensor& p);

}  // namespace tunedist::hooks
