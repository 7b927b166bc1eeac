#pragma once

// Light federated peers for the coordinator and round benchmarks: each keeps a real Session
// stream to the coordinator (or, with Options::core, a session on the coordinator's core with no
// gRPC between them) and answers it like shoal-peer does (initial model, one update per
// round, an EvalReport per published model, heartbeats), without LibTorch, data or training.
// The update is the fleet's model itself (every peer pushes the same bytes, uncopied); with
// Options::download each peer also pulls each model version it does not hold, as a peer does.
// With Options::secure a round is a secure-aggregation round (tests/bench/secure_light.h).

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/executor.h"
#include "libs/tensor/flat_model.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/coordinator/coordinator_core.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"
#include "tests/bench/secure_light.h"
#include "tests/bench/session_link.h"

namespace shoal::bench {

// When each peer saw the events of one round (steady clock, seconds since the fleet started).
struct RoundTimes {
  std::vector<double> started;     // RoundStarted arrivals
  std::vector<double> pushed;      // PushUpdate answers (the aggregator accepted the update)
  std::vector<double> published;   // ModelPublished arrivals
  std::vector<double> downloaded;  // Options::download: the published model pulled
};

// What went wrong; the benchmark's "errors" are the sum.
struct FleetErrors {
  std::atomic<int64_t> streams_broken{0};  // a session ended while the fleet was running
  std::atomic<int64_t> calls_failed{0};    // PutModel, PushUpdate or SecureAggregate gave up
  std::atomic<int64_t> rejected{0};        // executor full
  std::atomic<int64_t> events_lost{0};     // Options::core: the delivery was full
};

class LightPeer;

// N light peers in this process, each with its own channel (and TCP connection), all on one
// in-process channel (Options::channel) or all on the coordinator's core (Options::core), sharing a
// bounded executor for their blocking aggregator calls and one heartbeat thread. Up to
// kAggregatorConnections peers each have their own connection to their aggregator, as peers in
// processes of their own do (on one shared connection their pushes and downloads would move one
// after another); more peers share that many. Owned by the benchmark; thread-safe.
class Fleet {
 public:
  static constexpr int kAggregatorConnections = 64;

  struct Options {
    int peers = 1000;
    std::string name_prefix = "light";  // peer i asks for the id <prefix>-<i>
    std::string coordinator;
    std::shared_ptr<grpc::ChannelCredentials> credentials;  // mutual TLS; null = plaintext
    // When set, every session is a stream of this channel (a coordinator hosted in this
    // process: CoordinatorServer::InProcessChannel) instead of a TCP connection of its own.
    std::shared_ptr<grpc::Channel> channel;
    // When set (a coordinator hosted in this process: CoordinatorServer::core()), sessions call
    // the core directly, and its events reach the peers through one delivery thread
    // (each peer's in order): the coordinator's own cost, with no transport at all.
    coordinator::CoordinatorCore* core = nullptr;
    absl::Duration heartbeat_interval = absl::Seconds(2);
    size_t call_threads = 8;
    int64_t model_floats = 16;  // size of the model and of each update
    // Pull every model version a peer does not hold (GetModel, the values discarded as they
    // arrive): at RoundStarted before pushing, and after each ModelPublished.
    bool download = false;
    // Sessions opened per second (0: all at once). Real fleets arrive over time; all at once is
    // the reconnect storm after a coordinator restart.
    double join_rate = 0;
    // Each aggregator call's deadline, and how long a peer retries what the aggregator asks to
    // retry (back-pressure, a round not open yet) before it counts the call as failed.
    absl::Duration call_timeout = absl::Seconds(10);
    absl::Duration call_budget = absl::Seconds(30);
    // Secure aggregation (a task with privacy.secure_aggregation): each peer makes an Ed25519
    // identity key, sends its public half in its Hello and answers RoundStarted with
    // SecureAggregate (shoal-peer's SecureParticipant; the model's values are its update)
    // instead of PushUpdate. A call holds an executor thread for the whole round, so there are
    // at least `peers` call threads.
    bool secure = false;
    // With `secure`: the first drop_after_masking x peers (rounded) drop out of every round
    // once their masked update is sent (they cancel the stream at the consistency check).
    double drop_after_masking = 0;
    absl::Duration secure_timeout = absl::Minutes(2);  // a SecureAggregate call's deadline
  };

  explicit Fleet(Options options);
  ~Fleet();

  // Opens every session (the Hello is sent at once; Welcome arrives asynchronously), or with a
  // join_rate, starts a thread that opens them at that pace.
  void Start();
  // Cancels every session and waits until all have ended.
  void Stop();

  int welcomed() const { return welcomed_.load(); }
  int assigned() const { return assigned_.load(); }
  int64_t heartbeats_sent() const { return heartbeats_.load(); }
  int64_t push_retries() const { return push_retries_.load(); }
  int peers() const { return options_.peers; }
  bool secure() const { return options_.secure; }
  int dropping() const { return dropping_; }  // peers that drop out after masking
  // Update calls (PushUpdate, or SecureAggregate) finished, and the bytes they sent and
  // received (the messages' serialized sizes; a push's model payload).
  int64_t update_calls() const { return update_calls_.load(); }
  int64_t update_bytes_sent() const { return update_bytes_sent_.load(); }
  int64_t update_bytes_received() const { return update_bytes_received_.load(); }
  // Options::secure: the CPU seconds SecureParticipant took in `step` (BenchSecureParty::Step),
  // summed over the calls.
  double secure_step_seconds(int step) const { return secure_step_us_[step].load() / 1e6; }
  const FleetErrors& errors() const { return errors_; }
  // Rounds with every peer's published time, in order.
  std::map<uint64_t, RoundTimes> Rounds() const;
  // How many rounds every peer has started, pushed (or masked) and seen published; no copy.
  int CompleteRounds() const;

 private:
  friend class LightPeer;
  double Now() const;
  void Record(uint64_t round, int kind, double t);
  void HeartbeatLoop();

  const Options options_;
  const int dropping_;
  const std::chrono::steady_clock::time_point epoch_;
  std::shared_ptr<const tensor::FlatModel> model_;
  // Peer i calls its aggregator through aggregators_[i % size], each with connections of its own.
  std::vector<std::unique_ptr<aggregator::AggregatorClient>> aggregators_;
  ThreadPool calls_;
  std::unique_ptr<ThreadPool> delivery_;  // Options::core: one thread, each peer's events in order
  std::vector<std::unique_ptr<LightPeer>> peers_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> welcomed_{0};
  std::atomic<int> assigned_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<int64_t> push_retries_{0};
  std::atomic<int64_t> update_calls_{0};
  std::atomic<int64_t> update_bytes_sent_{0};
  std::atomic<int64_t> update_bytes_received_{0};
  std::atomic<int64_t> secure_step_us_[BenchSecureParty::kSteps] = {};
  FleetErrors errors_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, RoundTimes> rounds_ ABSL_GUARDED_BY(mu_);
  absl::Mutex beat_mu_;
  bool beat_stop_ ABSL_GUARDED_BY(beat_mu_) = false;
  std::thread beat_thread_;
  std::thread join_thread_;  // with a join_rate
};

}  // namespace shoal::bench
