// ShmComm: the group's parts put together, and each collective handed to its algorithm.
#include "shm/comm.h"

#include "shm/algorithms.h"
#include "shm/rounds.h"
#include "shm/zero_copy/zero_copy.h"

namespace tunedist::shm {

ShmComm::ShmComm(std::shared_ptr<core::Rendezvous> rendezvous, int rank, int size, core::ShmOptions options,
                 std::shared_ptr<SymmetricHeap> heap)
    : rounds_(std::make_unique<Rounds>(std::move(rendezvous), rank, size, options)) {
  if (heap != nullptr) {
    zeroCopy_ = std::make_unique<zero_copy::ZeroCopyCollectives>(*rounds_, std::move(heap));
  }
}

ShmComm::~ShmComm() = default;

int ShmComm::rank() const { return rounds_->rank(); }
int ShmComm::size() const { return rounds_->size(); }
const core::ShmOptions& ShmComm::options() const { return rounds_->options(); }
size_t ShmComm::reservedBytes() const { return rounds_->segment().reservedBytes(); }
bool ShmComm::attached() const { return rounds_->segment().attached(); }

void ShmComm::allreduce(const core::OpContext& ctx, const void* in, void* out, size_t count,
                        const kernels::ReduceArgs& args) {
  shm::allreduce(*rounds_, ctx, in, out, count, args);
}

void ShmComm::broadcast(const core::OpContext& ctx, void* buf, size_t bytes, int root) {
  shm::broadcast(*rounds_, ctx, buf, bytes, root);
}

void ShmComm::reduce(const core::OpContext& ctx, const void* in, void* out, size_t count,
                     const kernels::ReduceArgs& args, int root) {
  shm::reduce(*rounds_, ctx, in, out, count, args, root);
}

void ShmComm::allgather(const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs) {
  shm::allgather(*rounds_, ctx, in, bytes, outs);
}

void ShmComm::gather(const core::OpContext& ctx, const void* in, size_t bytes, void* const* outs, int root) {
  shm::gather(*rounds_, ctx, in, bytes, outs, root);
}

void ShmComm::scatter(const core::OpContext& ctx, const void* const* ins, void* out, size_t bytes, int root) {
  shm::scatter(*rounds_, ctx, ins, out, bytes, root);
}

void ShmComm::reduceScatter(const core::OpContext& ctx, const void* const* ins, void* out, size_t count,
                            const kernels::ReduceArgs& args) {
  shm::reduceScatter(*rounds_, ctx, ins, out, count, args);
}

void ShmComm::alltoallv(const core::OpContext& ctx, const void* const* sends, const size_t* sendBytes,
                        void* const* recvs, const size_t* recvBytes) {
  shm::alltoallv(*rounds_, ctx, sends, sendBytes, recvs, recvBytes);
}

void ShmComm::barrier(const core::OpContext& ctx) { shm::barrier(*rounds_, ctx); }

const RoundStoreChooser& ShmComm::roundStoreChooser(StorePolicy::Family family) const {
  return rounds_->storePolicy().chooser(family);
}

RoundStoreChooser& ShmComm::roundStoreChooser(StorePolicy::Family family) {
  return rounds_->storePolicy().chooser(family);
}

void ShmComm::abort(const std::string& reason, core::FailureKind kind) { rounds_->segment().abort(reason, kind); }
void ShmComm::throwIfFailed() { rounds_->segment().throwIfFailed(); }
bool ShmComm::failed() const { return rounds_->segment().failed(); }

}  // namespace tunedist::shm
