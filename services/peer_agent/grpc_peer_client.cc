#include "services/peer_agent/grpc_peer_client.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
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
    const tensor::ModelLayout& expected, CallCanceller* canceller) {
  auto stub = peer::v1::PeerService::NewStub(channels_.Get(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (canceller != nullptr && !canceller->Attach([&context] { context.TryCancel(); })) {
    return absl::CancelledError(absl::StrCat("GetSnapshot at peer ", address, ": cancelled"));
  }
  absl::Cleanup detach([canceller] {
    if (canceller != nullptr) canceller->Detach();
  });
  auto fail = [&](const absl::Status& s, bool rejected) {
    if (metrics_ != nullptr) {
      metrics_->peer_fetches_failed.Increment();
      if (rejected) metrics_->snapshots_rejected.Increment();
    }
    return WithContext(s, "GetSnapshot", address);
  };

  auto reader = stub->GetSnapshot(&context, request);
  common::v1::ModelChunk chunk;
  if (!reader->Read(&chunk)) {
    grpc::Status status = reader->Finish();
    if (!status.ok()) return fail(rpc::FromGrpcStatus(status), false);
    return fail(absl::InvalidArgumentError("snapshot stream ended before its ModelMeta"), true);
  }
  tensor::ReceivedModel received;
  absl::Status local;
  std::optional<tensor::FrameDecoder> decoder;
  if (chunk.item_case() != common::v1::ModelChunk::kMeta) {
    local = absl::InvalidArgumentError("snapshot stream does not start with a ModelMeta");
  } else {
    received.meta = chunk.meta();
    local = CheckSnapshotMeta(received.meta, request, expected);
    if (local.ok()) {
      decoder.emplace(tensor::FrameDecoder::ForLayout(expected, /*require_finite=*/true));
    }
  }
  while (local.ok() && reader->Read(&chunk)) {
    if (chunk.item_case() != common::v1::ModelChunk::kFrame) {
      local = absl::InvalidArgumentError("snapshot stream carries a second ModelMeta");
      break;
    }
    local = decoder->Add(chunk.frame());
  }
  if (!local.ok()) {
    context.TryCancel();
    reader->Finish();
    return fail(local, true);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return fail(rpc::FromGrpcStatus(status), false);
  const uint64_t bytes = decoder->bytes_received();
  absl::StatusOr<tensor::FlatModel> model = std::move(*decoder).Finish();
  if (!model.ok()) return fail(model.status(), true);
  received.model = *std::move(model);
  if (metrics_ != nullptr) metrics_->peer_bytes_pulled.Increment(static_cast<double>(bytes));
  return received;
}

absl::Status GrpcPeerClient::Probe(const std::string& address,
                                   const peer::v1::ProbeRequest& request, absl::Time deadline,
                                   CallCanceller* canceller) {
  auto stub = peer::v1::PeerService::NewStub(channels_.Get(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (canceller != nullptr && !canceller->Attach([&context] { context.TryCancel(); })) {
    return absl::CancelledError(absl::StrCat("Probe at peer ", address, ": cancelled"));
  }
  absl::Cleanup detach([canceller] {
    if (canceller != nullptr) canceller->Detach();
  });
  peer::v1::ProbeResponse response;
  return WithContext(rpc::FromGrpcStatus(stub->Probe(&context, request, &response)), "Probe",
                     address);
}

}  // namespace shoal::peer
