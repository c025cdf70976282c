// all_reduce of a sparse COO tensor (DDP with nn.Embedding(sparse=True)), with gloo's semantics and results.
//
// Algorithm (one operation on the executor, several engine calls under its context):
//   1. Coalesce the input, so its indices are unique and its values one row per index.
//   2. All-gather each rank's header (sparse dims, dense dims, nnz, dtype, number of dims); every rank checks the
//      same things against the same gathered data, so a disagreement fails every rank alike, naming the ranks.
//   3. All-gather the sizes and check they agree.
//   4. All-gather indices and values, each padded to the largest nnz (the engine's all-gather moves equal blocks).
//   5. Sum the ranks' sparse tensors in rank order and coalesce, as gloo does (bit-identical results), then copy the
//      sum into the caller's tensor: its indices and values are replaced, as with gloo.
// Only SUM is defined for sparse tensors, as with gloo.
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include "backend/cpu/cpu_backend.h"

namespace tunedist::cpu {
namespace {

constexpr const char* kOp = "all_reduce";

// Header fields of step 2.
enum Field : int64_t { kSparseDim = 0, kDenseDim, kNnz, kDType, kDims, kFields };

// Rank p's data in rows of one gathered buffer: gathered[p] for every p.
std::vector<at::Tensor> rowsOf(const at::Tensor& gathered) {
  std::vector<at::Tensor> rows;
  rows.reserve(gathered.size(0));
  for (int64_t p = 0; p < gathered.size(0); ++p) {
    rows.push_back(gathered.select(0, p));
  }
  return rows;
}

// Steps 2-3: every rank's header, after checking that the ranks agree on everything but nnz.
at::Tensor gatherHeaders(engine::HostCollectives& engine, const core::OpContext& ctx, const at::Tensor& in, int rank,
                         int size) {
  at::Tensor header = at::empty({kFields}, at::kLong);
  auto* h = header.data_ptr<int64_t>();
  h[kSparseDim] = in.sparse_dim();
  h[kDenseDim] = in.dense_dim();
  h[kNnz] = in._nnz();
  h[kDType] = static_cast<int64_t>(in.scalar_type());
  h[kDims] = in.dim();
  at::Tensor headers = at::empty({size, kFields}, at::kLong);
  engine.allgather(ctx, header, rowsOf(headers));
  at::Tensor sizes = at::tensor(in.sizes().vec(), at::kLong);
  for (int p = 0; p < size; ++p) {
    auto* o = headers[p].data_ptr<int64_t>();
    TORCH_CHECK(o[kSparseDim] == h[kSparseDim] && o[kDenseDim] == h[kDenseDim] && o[kDims] == h[kDims] &&
                    o[kDType] == h[kDType],
                "tunedist: ", kOp, " of a sparse tensor on rank ", rank, ": rank ", p, " has ", o[kSparseDim],
                " sparse and ", o[kDenseDim], " dense dims of dtype ", static_cast<at::ScalarType>(o[kDType]),
                ", this rank ", h[kSparseDim], " and ", h[kDenseDim], " of dtype ", in.scalar_type(),
                "; every rank must pass a tensor of the same shape and dtype");
  }
  at::Tensor allSizes = at::empty({size, in.dim()}, at::kLong);
  engine.allgather(ctx, sizes, rowsOf(allSizes));
  for (int p = 0; p < size; ++p) {
    TORCH_CHECK(allSizes[p].equal(sizes), "tunedist: ", kOp, " of a sparse tensor on rank ", rank, ": rank ", p,
                " passed sizes ", c10::IntArrayRef(allSizes[p].data_ptr<int64_t>(), in.dim()), ", this rank ",
                in.sizes(), "; every rank must pass a tensor of the same shape");
  }
  return headers;
}

// `t` padded with zeros along dim `d` to `length`.
at::Tensor padded(const at::Tensor& t, int64_t d, int64_t length) {
  auto shape = t.sizes().vec();
  shape[d] = length;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(d, 0, t.size(d)).copy_(t);
  return out;
}

at::Tensor gatherPadded(engine::HostCollectives& engine, const core::OpContext& ctx, const at::Tensor& t, int size) {
  auto shape = t.sizes().vec();
  shape.insert(shape.begin(), size);
  at::Tensor gathered = at::empty(shape, t.options());
  engine.allgather(ctx, t, rowsOf(gathered));
  return gathered;
}

// Steps 1-5; returns the coalesced sum.
at::Tensor sparseSum(engine::HostCollectives& engine, const core::OpContext& ctx, const at::Tensor& t, int rank,
                     int size) {
  at::Tensor in = t.coalesce();
  at::Tensor headers = gatherHeaders(engine, ctx, in, rank, size);
  const int64_t maxNnz = headers.select(1, kNnz).max().item<int64_t>();
  if (maxNnz == 0) {
    return in;
  }
  at::Tensor indices = gatherPadded(engine, ctx, padded(in._indices(), 1, maxNnz), size);
  at::Tensor values = gatherPadded(engine, ctx, padded(in._values(), 0, maxNnz), size);
  at::Tensor sum;
  for (int p = 0; p < size; ++p) {
    const int64_t nnz = headers[p][kNnz].item<int64_t>();
    at::Tensor part = at::sparse_coo_tensor(indices[p].narrow(1, 0, nnz).contiguous(),
                                            values[p].narrow(0, 0, nnz).contiguous(), in.sizes(), in.options());
    if (p == 0) {
      sum = part;
    } else {
      sum += part;
    }
  }
  return sum.coalesce();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CpuBackend::allreduceSparse(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  guardCall(kOp, [&] {
    const at::Tensor& t = tensors[0];
    TORCH_CHECK(t.device().is_cpu(), "the sparse tensor must be on the CPU, got ", t.device());
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
                "a sparse tensor can only be summed (ReduceOp.SUM), as with gloo; got reduce op ",
                int(opts.reduceOp.op_));
  });
  at::Tensor t = tensors[0];
  const size_t bytes = t._values().nbytes() + t._indices().nbytes();
  const int rank = rank_;
  const int size = size_;
  return launch(c10d::OpType::ALLREDUCE, "tuned:all_reduce_sparse", tensors, tensors, opts.asyncOp, opts.timeout, bytes,
                [t, rank, size](engine::HostCollectives& engine, const core::OpContext& ctx) {
                  // As gloo: the gradients DDP hands in are plain tensors; keep autograd out of the local sums.
                  at::AutoDispatchBelowAutograd guard;
                  at::Tensor sum = sparseSum(engine, ctx, t, rank, size);
                  t.copy_(sum);
                });
}

}  // namespace tunedist::cpu
