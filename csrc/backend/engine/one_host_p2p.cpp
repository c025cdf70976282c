#include "backend/engine/one_host_p2p.h"

#include "backend/engine/tensors.h"

namespace tunedist::engine {

void OneHostP2p::isend(int dst, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  engine_->isend(dst, tag, data.data_ptr(), tensorBytes(data), deadline, std::move(done));
}

void OneHostP2p::irecv(int src, int tag, const at::Tensor& data, Clock::time_point deadline, Done done) {
  engine_->irecv(src, tag, data.data_ptr(), tensorBytes(data), deadline, std::move(done));
}

}  // namespace tunedist::engine
