#include "services/peer_agent/peer_service.h"

#include "absl/strings/str_cat.h"
#include "libs/rpc/model_stream.h"

namespace shoal::peer {

grpc::ServerWriteReactor<common::v1::ModelChunk>* PeerServiceImpl::GetSnapshot(
    grpc::CallbackServerContext* context, const shoal::peer::v1::GetSnapshotRequest* request) {
  std::optional<Snapshot> snapshot = store_.Latest();
  if (!snapshot) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "this peer has published no snapshot yet"));
  }
  if (!request->task().empty() && request->task() != snapshot->task) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("this peer has no snapshot of task \"", request->task(),
                                  "\" (it has \"", snapshot->task, "\")")));
  }
  common::v1::ModelMeta meta =
      tensor::MakeModelMeta(snapshot->task, snapshot->version, *snapshot->model);
  PeerMetrics* metrics = &metrics_;
  return new rpc::ModelWriteReactor(
      snapshot->model, std::move(meta),
      [metrics](uint64_t bytes_sent, bool) { metrics->bytes_sent.Increment(bytes_sent); });
}

}  // namespace shoal::peer
