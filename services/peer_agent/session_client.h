#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/rpc/address_list.h"
#include "services/peer_agent/peer_metrics.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::peer {

struct SessionClientOptions {
  // HOST:PORT[,HOST:PORT...] of the coordinator's SessionService: the active coordinator and
  // its standbys, tried in turn (rpc::AddressList).
  std::string coordinator;
  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;  // null = plaintext (tests)
  coordinator::v1::Hello hello;  // sent first on every (re)connect
  // Before its first Hello the client times an upload of this many bytes to the coordinator
  // (SessionService.MeasureUpload) and reports it in hello.capacity; 0: no measurement.
  uint64_t upload_probe_bytes = 0;
  absl::Duration upload_probe_timeout = absl::Seconds(20);
  // Where the measured upload (bytes/s; 0: not measured) is kept, for the Hello and the peer's
  // mode runners (ModeRunnerDeps::measured_upload); null: in the client alone.
  std::shared_ptr<std::atomic<double>> measured_upload;
  // Before each Hello the client asks for the registered aggregators
  // (SessionService.ListAggregators) and reports its round trip to each in
  // hello.capacity.aggregator_rtts, each measured within this time; 0: no measurement.
  absl::Duration aggregator_rtt_timeout = absl::Seconds(1);
  // Between passes over the coordinators' addresses (rpc::PassBackoff), capped at 1 s so that a
  // peer is back within about a second of a coordinator serving again (with gRPC's own
  // reconnect backoff, libs/rpc/channel.cc), however long the outage was.
  BackoffOptions reconnect_backoff{absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.2};
  absl::Duration default_heartbeat = absl::Seconds(2);  // until Welcome says otherwise
  absl::Duration leave_grace = absl::Seconds(2);        // wait for the coordinator to close
  // A coordinator that took the Hello but sent no Welcome within this is given up on: the
  // stream is cancelled and the client reconnects (a stream that stays silent would otherwise
  // hold the peer unconnected for good).
  absl::Duration welcome_timeout = absl::Seconds(10);

  absl::Status Validate() const;
};

// Keeps the peer's one Session stream to the coordinator: connects (the coordinator may start
// after the peer), says Hello, hands every event to `on_event` from its reader thread, sends
// heartbeats, and reconnects with capped backoff and jitter when the stream breaks (then says
// Hello again with the peer id it was given, so the id stays the same). A session that ended is
// opened again at the same address first; each attempt that fails moves on to the next
// coordinator address, so a peer follows a fail-over to a standby and re-joins its tasks there.
//
// The session stream lives as long as the peer, so it has no deadline: a dead coordinator is
// detected by the channel's keepalive and by the stream ending.
//
// Threads: a reader thread (connect loop) and a heartbeat thread, both owned and joined by
// Leave()/the destructor. Send() is thread-safe; writes are serialised by a mutex.
class SessionClient {
 public:
  using EventFn = std::function<void(const coordinator::v1::CoordinatorEvent&)>;
  using DisconnectFn = std::function<void()>;

  static absl::StatusOr<std::unique_ptr<SessionClient>> Create(SessionClientOptions options,
                                                               PeerMetrics& metrics,
                                                               EventFn on_event,
                                                               DisconnectFn on_disconnect);
  ~SessionClient();  // Leave("shutdown") if still running
  SessionClient(const SessionClient&) = delete;
  SessionClient& operator=(const SessionClient&) = delete;

  void Start();
  // Sends one message. Errors: UNAVAILABLE when the session is not up or the write fails.
  absl::Status Send(const coordinator::v1::PeerMessage& message) ABSL_LOCKS_EXCLUDED(write_mu_);
  // Sends Leave, closes the stream, stops reconnecting and joins the threads. Idempotent.
  void Leave(const std::string& reason);

  // Ends the current session to be given another relay (Hello.wants_relay): the session is
  // opened again at once, its Hellos naming `relay` as lost (Hello.lost_relay). No-op after
  // Leave().
  void ReconnectWithout(const std::string& relay) ABSL_LOCKS_EXCLUDED(mu_);
  // From now on the Hellos ask for a relay (Hello.wants_relay, relay_fallback kept): after
  // RelayAssigned, so that a reconnect keeps the peer relayed while its relay is registered.
  void AskForRelay() ABSL_LOCKS_EXCLUDED(mu_);

  bool connected() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string peer_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until connected (Welcome received) or `timeout` passes; returns connected().
  bool WaitConnected(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Stream =
      grpc::ClientReaderWriter<coordinator::v1::PeerMessage, coordinator::v1::CoordinatorEvent>;

  SessionClient(SessionClientOptions options, PeerMetrics& metrics, EventFn on_event,
                DisconnectFn on_disconnect);
  void RunLoop();
  void HeartbeatLoop();
  // Times the upload of options_.upload_probe_bytes; false when it should be tried again with
  // the next connection attempt (the coordinator could not be reached).
  bool MeasureUpload(const rpc::AddressList::Target& target) ABSL_LOCKS_EXCLUDED(mu_);
  // Measures the round trips to the coordinator's aggregators for the next Hello (none when the
  // coordinator cannot be asked).
  void MeasureAggregatorRtts(const rpc::AddressList::Target& target) ABSL_LOCKS_EXCLUDED(mu_);
  // One connection to `target`: Hello, Welcome, events until the stream ends. Returns the final
  // status.
  grpc::Status RunOnce(const rpc::AddressList::Target& target, bool* welcomed);
  // Sleeps up to `d`; returns false when stopping.
  bool SleepUnlessStopping(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

  const SessionClientOptions options_;
  PeerMetrics& metrics_;
  const EventFn on_event_;
  const DisconnectFn on_disconnect_;
  std::unique_ptr<rpc::AddressList> coordinators_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  uint64_t heartbeat_generation_ ABSL_GUARDED_BY(mu_) = 0;       // +1 per Welcome
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the current call
  absl::Time welcome_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // of that call
  std::string lost_relay_ ABSL_GUARDED_BY(mu_);                                // Hello.lost_relay
  bool wants_relay_ ABSL_GUARDED_BY(mu_) = false;                              // AskForRelay()
  std::vector<common::v1::AggregatorRtt> aggregator_rtts_ ABSL_GUARDED_BY(mu_);

  // Guards writes on the current stream; `stream_` is set only while connected.
  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);
  Stream* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;

  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace shoal::peer
