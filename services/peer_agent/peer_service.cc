#include "services/peer_agent/peer_service.h"

#include "absl/strings/str_cat.h"
#include "libs/rpc/model_stream.h"

namespace shoal::peer {
namespace {

const char* KindName(peer::v1::SnapshotKind kind) {
  switch (kind) {
    case peer::v1::SNAPSHOT_KIND_LATEST:
      return "LATEST";
    case peer::v1::SNAPSHOT_KIND_ROUND_UPDATE:
      return "ROUND_UPDATE";
    case peer::v1::SNAPSHOT_KIND_GLOBAL:
      return "GLOBAL";
    default:
      return "unknown";
  }
}

}  // namespace

grpc::ServerWriteReactor<common::v1::ModelChunk>* PeerServiceImpl::GetSnapshot(
    grpc::CallbackServerContext* context, const shoal::peer::v1::GetSnapshotRequest* request) {
  const peer::v1::SnapshotKind kind = request->kind();
  if (!peer::v1::SnapshotKind_IsValid(kind)) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("unknown snapshot kind ", static_cast<int>(kind))));
  }
  std::optional<Snapshot> snapshot = store_.Get(kind);
  if (!snapshot || !snapshot->model) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("this peer has published no ", KindName(kind), " snapshot yet")));
  }
  if (!request->task().empty() && request->task() != snapshot->task) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("this peer has no snapshot of task \"", request->task(),
                                  "\" (it has \"", snapshot->task, "\")")));
  }
  const bool by_round = kind != peer::v1::SNAPSHOT_KIND_LATEST;
  if (by_round && request->round() != snapshot->round) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     absl::StrCat("asked for the ", KindName(kind), " snapshot of round ",
                                  request->round(), ", this peer holds round ", snapshot->round)));
  }
  common::v1::ModelMeta meta = tensor::MakeModelMeta(
      snapshot->task, by_round ? snapshot->round : snapshot->version, *snapshot->model);
  meta.set_num_samples(snapshot->num_samples);
  meta.set_clock(snapshot->clock);
  meta.set_loss(snapshot->loss);
  PeerMetrics* metrics = &metrics_;
  return new rpc::ModelWriteReactor(
      snapshot->model, std::move(meta), [metrics](uint64_t bytes_sent, bool completed) {
        metrics->bytes_sent.Increment(static_cast<double>(bytes_sent));
        metrics->snapshots_served.Increment();
        if (!completed) metrics->snapshots_aborted.Increment();
      });
}

grpc::ServerUnaryReactor* PeerServiceImpl::Probe(grpc::CallbackServerContext* context,
                                                 const shoal::peer::v1::ProbeRequest* request,
                                                 shoal::peer::v1::ProbeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (options_.peer_id) response->set_peer_id(options_.peer_id());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace shoal::peer
