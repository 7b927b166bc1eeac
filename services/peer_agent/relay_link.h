#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"

namespace shoal::peer {

struct RelayLinkOptions {
  std::string relay;    // HOST:PORT of the aggregator that relays for this peer
  std::string peer_id;  // this peer's id (under mutual TLS, its certificate's name)
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  absl::Duration max_backoff = absl::Seconds(2);          // between reconnection attempts
  // Called once per outage, from the link's thread, when no stream has been attached for
  // give_up_after (since the link started or its last stream broke); the link keeps trying.
  // Zero or no callback: never.
  absl::Duration give_up_after = absl::ZeroDuration();
  std::function<void()> on_give_up;
};

// A peer behind NAT (shoal-peer --relay): keeps one RelayService.Relay stream open to its
// relay and answers the PeerService calls that come down it from the store, as PeerServiceImpl
// would (GetSnapshot: the snapshot's ModelMeta and frames; Probe). Reconnects with backoff
// (0.1 s doubling to max_backoff) while the relay is unreachable, logging each change once.
// Starts on construction; the destructor stops it and joins its thread. The store and metrics
// must outlive it.
class RelayLink {
 public:
  RelayLink(RelayLinkOptions options, const SnapshotStore& store, PeerMetrics& metrics);
  ~RelayLink();
  RelayLink(const RelayLink&) = delete;
  RelayLink& operator=(const RelayLink&) = delete;

  // OK once the relay has attached a stream of this peer (at least once). DEADLINE_EXCEEDED
  // with the latest error otherwise; the error itself when the relay refused this peer
  // (PERMISSION_DENIED, INVALID_ARGUMENT).
  absl::Status WaitAttached(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();
  // One stream, until it breaks or the link stops: the status it ended with; `attached` tells
  // whether the relay attached it.
  absl::Status RunStream(bool* attached) ABSL_LOCKS_EXCLUDED(mu_);

  const RelayLinkOptions options_;
  const SnapshotStore& store_;
  PeerMetrics& metrics_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;  // at least once
  absl::Status last_error_ ABSL_GUARDED_BY(mu_) = absl::UnavailableError("not connected yet");
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream in flight
  std::thread thread_;  // last: started when everything else is ready
};

}  // namespace shoal::peer
