// Point-to-point: Send is `count` elements to rank `root` in chunks, spread over the channels;
// Recv is the same chunks from rank `root`. Both ends split the data identically, so the k-th
// send on a channel is the k-th receive there.
//
// Whether the link exists depends on the rank, which Supports does not know: Build answers
// kNotSupported for a rank that cannot reach its peer. A rank does not send to itself: built
// for every rank (tools, tests), the peer's own plan is empty.
#include <utility>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "p2p";

class P2p final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kP2p; }

  Status Supports(const CollectiveRequest& request, const CommTopology&) const override {
    if (request.collective != Collective::kSend && request.collective != Collective::kRecv)
      return NotImplemented(id(), request);
    return Status::Ok();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const bool send = request.collective == Collective::kSend;
    const int peer = request.root;
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    if (rank == peer) return std::move(b.plan);
    KZ_RETURN_IF_ERROR(send ? RequireLink(shape, rank, peer, kName, "the send's link")
                            : RequireLink(shape, peer, rank, kName, "the receive's link"));
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      for (uint64_t k = 0; k < PieceCount(R.count, b.chunk); ++k) {
        const Range pc = Piece(R, b.chunk, k);
        if (send) b.Send(c, peer, b.In(pc));
        else b.Recv(c, peer, Builder::Out(pc));
      }
    }
    return std::move(b.plan);
  }
};

}  // namespace

const AlgorithmImpl& P2pAlgorithm() {
  static const P2p impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
