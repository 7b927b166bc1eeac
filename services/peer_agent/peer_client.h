#pragma once

#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/model_stream.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/peer_metrics.h"
#include "shoal/peer/v1/peer.pb.h"

namespace grpc {
class ClientContext;
}

namespace shoal::peer {

// Cancels a PeerClient call from another thread (e.g. gossip's timeout_ms, or a newer event).
// Cancel() aborts the call running with this token now (TryCancel) and makes every later call
// with it fail CANCELLED at once. Thread-safe; must outlive the calls that use it.
class CallCanceller {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PeerClient;
  // Registers `context` as the running call; false when already cancelled.
  bool Attach(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// Client of other peers' PeerService (decentralized and gossip modes). Keeps one channel per
// peer address, secured with this peer's TLS client credentials. Every call is one attempt
// bounded by its deadline (the channel itself retries UNAVAILABLE while the deadline allows);
// retrying is the caller's business. Errors name the call and the address.
// Thread-safe; the metrics (optional) must outlive it. Owned by the PeerServer.
class PeerClient {
 public:
  // `credentials` null = plaintext (tests in one process). `metrics` may be null.
  explicit PeerClient(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      PeerMetrics* metrics = nullptr);
  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;

  // Streams the snapshot `request` asks for from the peer at `address` (PeerService.GetSnapshot)
  // and checks it while decoding: the tensors must be exactly `expected` (names, shapes, order,
  // float32), every value finite, the digests right, ModelMeta.task the one asked for (when the
  // request names one) and, for ROUND_UPDATE/GLOBAL, ModelMeta.version == request.round.
  // A snapshot that fails these checks is INVALID_ARGUMENT (counted in snapshots_rejected);
  // server errors come through with their code (NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE,
  // DEADLINE_EXCEEDED, CANCELLED). Payload bytes count in peer_bytes_pulled.
  absl::StatusOr<rpc::ReceivedModel> Fetch(const std::string& address,
                                           const peer::v1::GetSnapshotRequest& request,
                                           absl::Time deadline, const tensor::ModelLayout& expected,
                                           CallCanceller* canceller = nullptr);

  // PeerService.Probe: OK when the peer answered.
  absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest& request,
                     absl::Time deadline, CallCanceller* canceller = nullptr);

  // Drops the cached channel of `address` (e.g. a peer that left). Calls in flight finish.
  void Forget(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Stub;
  std::shared_ptr<Stub> StubFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  PeerMetrics* const metrics_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::peer
