#include "services/peer_agent/grpc_peer_client.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/tensor/frame_codec.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::peer {
namespace {

absl::Status WithContext(const absl::Status& s, const char* what, const std::string& address) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, " at peer ", address, ": ", s.message()));
}

}  // namespace

absl::StatusOr<tensor::ReceivedModel> GrpcPeerClient::Fetch(
    const std::string& address, const peer::v1::GetSnapshotRequest& request, absl::Time deadline,
    const tensor::ModelLayout& expected, CallCanceller* canceller, std::vector<float> buffer) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (canceller != nullptr && !canceller->Attach([&context] { context.TryCancel(); })) {
    return absl::CancelledError(absl::StrCat("GetSnapshot at peer ", address, ": cancelled"));
  }
  absl::Cleanup detach([canceller] {
    if (canceller != nullptr) canceller->Detach();
  });
  // A peer behind NAT is reached at its relay (HOST:PORT/PEER_ID).
  const PeerAddress target = SplitPeerAddress(address);
  peer::v1::GetSnapshotRequest sent = request;
  sent.set_relay_to(target.relay_to);
  // Read raw: chunks are decoded straight from the received slices, into the layout expected.
  auto reader = rpc::OpenRawReader(*channels_.Get(target.dial),
                                   "/shoal.peer.v1.PeerService/GetSnapshot", context, sent);
  rpc::StreamStats stats;
  absl::StatusOr<tensor::ReceivedModel> received = rpc::ReadModelStreamWith(
      *reader,
      [&](const common::v1::ModelMeta& meta) -> absl::StatusOr<tensor::FrameDecoder> {
        SHOAL_RETURN_IF_ERROR(CheckSnapshotMeta(meta, request, expected));
        return tensor::FrameDecoder::ForLayout(expected, /*require_finite=*/true,
                                               std::move(buffer));
      },
      &context, &stats);
  if (!received.ok()) {
    if (metrics_ != nullptr) {
      metrics_->peer_fetches_failed.Increment();
      if (stats.refused) metrics_->snapshots_rejected.Increment();
    }
    return WithContext(received.status(), "GetSnapshot", address);
  }
  if (metrics_ != nullptr) {
    metrics_->peer_bytes_pulled.Increment(static_cast<double>(stats.bytes_received));
  }
  return received;
}

absl::Status GrpcPeerClient::Probe(const std::string& address,
                                   const peer::v1::ProbeRequest& request, absl::Time deadline,
                                   CallCanceller* canceller) {
  const PeerAddress target = SplitPeerAddress(address);
  peer::v1::ProbeRequest sent = request;
  sent.set_relay_to(target.relay_to);
  auto stub = peer::v1::PeerService::NewStub(channels_.Get(target.dial));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (canceller != nullptr && !canceller->Attach([&context] { context.TryCancel(); })) {
    return absl::CancelledError(absl::StrCat("Probe at peer ", address, ": cancelled"));
  }
  absl::Cleanup detach([canceller] {
    if (canceller != nullptr) canceller->Detach();
  });
  peer::v1::ProbeResponse response;
  return WithContext(rpc::FromGrpcStatus(stub->Probe(&context, sent, &response)), "Probe", address);
}

}  // namespace shoal::peer
