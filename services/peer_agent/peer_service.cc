#include "services/peer_agent/peer_service.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"

namespace shoal::peer {

grpc::ServerWriteReactor<grpc::ByteBuffer>* PeerServiceImpl::GetSnapshot(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  peer::v1::GetSnapshotRequest request;
  if (!rpc::ParseRawRequest(*raw_request, &request)) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse GetSnapshotRequest"));
  }
  absl::StatusOr<SnapshotStore::Served> served = store_.Serve(request);
  if (!served.ok()) return rpc::MakeFailedModelWriteReactor(rpc::ToGrpcStatus(served.status()));
  PeerMetrics* metrics = &metrics_;
  rpc::Pacer* pacer = options_.pacer;
  const size_t chunk_bytes = pacer != nullptr ? pacer->MessageBytes(tensor::kDefaultChunkBytes)
                                              : tensor::kDefaultChunkBytes;
  const double rate = pacer != nullptr ? pacer->rate() : 0;
  metrics_.serve_pacing_rate.Set(rate);
  if (logged_rate_.exchange(rate) != rate) {
    if (rate > 0) {
      LogInfo(absl::StrFormat("serving snapshots paced at %.1f Mbit/s (--serve-pacing)",
                              rate * 8 / 1e6));
    } else {
      LogInfo("serving snapshots unpaced (--serve-pacing)");
    }
  }
  return new rpc::ModelWriteReactor(
      std::move(served->model), std::move(served->meta),
      [metrics](uint64_t bytes_sent, bool completed) {
        metrics->bytes_sent.Increment(static_cast<double>(bytes_sent));
        metrics->snapshots_served.Increment();
        if (!completed) metrics->snapshots_aborted.Increment();
      },
      chunk_bytes, pacer);
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
