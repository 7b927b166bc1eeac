#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "shoal/peer/v1/peer.pb.h"

namespace shoal::peer {

// Cancels a PeerClient call from another thread (e.g. gossip's timeout_ms, or a newer event).
// Cancel() aborts the call running with this token now and makes every later call with it fail
// CANCELLED at once. Thread-safe; must outlive the calls that use it.
class CallCanceller {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // For PeerClient implementations: registers how to abort the call now running with this
  // token; false when it is already cancelled (the call must not start). Detach() when it ends.
  bool Attach(std::function<void()> abort) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> abort_ ABSL_GUARDED_BY(mu_);
};

// The checks a fetched snapshot's ModelMeta must pass before its frames are decoded: ModelMeta.task
// the one asked for (when the request names one), ModelMeta.version == request.round for
// ROUND_UPDATE/GLOBAL, the tensor count and bytes of `expected` (at most those bytes for a
// compressed delta), and ModelMeta.delta only for ROUND_UPDATE. INVALID_ARGUMENT otherwise.
absl::Status CheckSnapshotMeta(const common::v1::ModelMeta& meta,
                               const peer::v1::GetSnapshotRequest& request,
                               const tensor::ModelLayout& expected);

// Client of other peers' PeerService (decentralized and gossip modes). An interface: the gRPC
// implementation is GrpcPeerClient (grpc_peer_client.h, its own target), tests use in-memory
// ones (tests/fakes). Every call is one attempt bounded by its deadline; retrying is the
// caller's business. Errors name the call and the address. Implementations are thread-safe.
class PeerClient {
 public:
  virtual ~PeerClient() = default;

  // Fetches the snapshot `request` asks for from the peer at `address` (PeerService.GetSnapshot)
  // and checks it: the tensors must be exactly `expected` (names, shapes, order, float32), every
  // value finite, the digests right, ModelMeta.task the one asked for (when the request names
  // one) and, for ROUND_UPDATE/GLOBAL, ModelMeta.version == request.round. A ROUND_UPDATE may
  // come compressed (ModelMeta.delta): its tensors are decoded to float32 and checked the same
  // way, and the caller tells a delta from a model by the meta. A snapshot that fails
  // these checks is INVALID_ARGUMENT; server errors come through with their code (NOT_FOUND,
  // FAILED_PRECONDITION, UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED). The values are decoded
  // into `buffer` (its contents overwritten, its storage reused: tensor::BufferPool).
  virtual absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address,
                                                      const peer::v1::GetSnapshotRequest& request,
                                                      absl::Time deadline,
                                                      const tensor::ModelLayout& expected,
                                                      CallCanceller* canceller = nullptr,
                                                      std::vector<float> buffer = {}) = 0;

  // PeerService.Probe: OK when the peer answered.
  virtual absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest& request,
                             absl::Time deadline, CallCanceller* canceller = nullptr) = 0;

  // Forgets what is cached for `address` (e.g. a peer that left). Calls in flight finish.
  virtual void Forget(const std::string& address) = 0;
};

}  // namespace shoal::peer
