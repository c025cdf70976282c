// Cross-host all_to_all: every pair agrees on its sizes, then gloo all_to_all over every rank, as bytes.
#include "backend/engine/hier/algorithms.h"

#include <c10/util/Exception.h>

namespace tunedist::engine::hier {
namespace {

// Byte counts per peer; the blocks lie back to back in the byte tensors `src` and `dst`.
void alltoallPacked(Ctx c, const at::Tensor& src, const std::vector<int64_t>& sendBytes, const at::Tensor& dst,
                    const std::vector<int64_t>& recvBytes) {
  // Every rank publishes what it sends to and expects from each peer; each pair must agree.
  const int size = c.x.size();
  std::vector<int64_t> desc = describe(shm::OpCode::kAlltoall, c.op.seq, 0, 0);
  agreeAmongLeaders(c, desc);
  desc.insert(desc.end(), sendBytes.begin(), sendBytes.end());
  desc.insert(desc.end(), recvBytes.begin(), recvBytes.end());
  auto all = c.x.gatherDescs(c.x.everyone(), c.op, desc);
  const size_t head = describeFields().size();
  int64_t total = 0;
  for (int p = 0; p < size; ++p) {
    TORCH_CHECK(all[size_t(p)][0] == desc[0] && all[size_t(p)][1] == desc[1], "ranks disagree on the operation: rank ",
                p, " runs op ", all[size_t(p)][0], " seq ", all[size_t(p)][1], " but rank ", c.x.rank(), " runs op ",
                desc[0], " seq ", desc[1]);
    for (int q = 0; q < size; ++q) {
      const int64_t sent = all[size_t(p)][head + size_t(q)];
      const int64_t expected = all[size_t(q)][head + size_t(size) + size_t(p)];
      TORCH_CHECK(sent == expected, "all_to_all sizes disagree: rank ", p, " sends ", sent, " bytes to rank ", q,
                  ", which expects ", expected, " bytes from it");
      total += sent;
    }
  }
  if (total == 0) {
    return;
  }
  std::vector<int64_t> outSplits = recvBytes;
  std::vector<int64_t> inSplits = sendBytes;
  at::Tensor in = src;
  at::Tensor out = dst;
  c.x.countData(size_t(src.numel()));
  c.x.wait(
      c.x.group(c.x.everyone())->alltoall_base(out, in, outSplits, inSplits, withTimeout<c10d::AllToAllOptions>(c)),
      c.op);
}

}  // namespace

// The blocks travel as bytes, packed into one buffer per direction for gloo's all_to_all.
void alltoallv(Ctx c, const std::vector<const void*>& sends, const std::vector<size_t>& sendBytes,
               const std::vector<void*>& recvs, const std::vector<size_t>& recvBytes) {
  std::vector<int64_t> sendSplits(sendBytes.begin(), sendBytes.end());
  std::vector<int64_t> recvSplits(recvBytes.begin(), recvBytes.end());
  int64_t sendTotal = 0;
  int64_t recvTotal = 0;
  for (size_t p = 0; p < sends.size(); ++p) {
    sendTotal += sendSplits[p];
    recvTotal += recvSplits[p];
  }
  at::Tensor src = at::empty({sendTotal}, at::kByte);
  at::Tensor dst = at::empty({recvTotal}, at::kByte);
  int64_t off = 0;
  for (size_t p = 0; p < sends.size(); ++p) {
    kernels::copyBytes(src.data_ptr<uint8_t>() + off, sends[p], sendBytes[p]);
    off += sendSplits[p];
  }
  alltoallPacked(c, src, sendSplits, dst, recvSplits);
  off = 0;
  for (size_t p = 0; p < recvs.size(); ++p) {
    kernels::copyBytes(recvs[p], dst.data_ptr<uint8_t>() + off, recvBytes[p]);
    off += recvSplits[p];
  }
}

}  // namespace tunedist::engine::hier
