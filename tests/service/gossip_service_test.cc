// Gossip runner end to end in one process: peers with a real PeerService on 127.0.0.1:0, a real
// PeerClient, real LibTorch training on a small slice of Fashion-MNIST. Two honest peers exchange
// snapshots (and end closer than peers that never talk); bad neighbours (wrong layout, NaN, no
// state yet, unreachable, farther than max_update_norm) are rejected and lose score without
// stopping training; Stop is prompt; membership updates apply at once.

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/rpc/server.h"
#include "libs/task/task_file.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/modes/gossip/gossip_runner.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::peer {
namespace {

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

struct Data {
  training::RawDataset train, test;
};

const Data& SharedData() {
  static const Data* data = [] {
    auto* d = new Data;
    d->train = *training::LoadFashionMnist(kDataDir, training::Split::kTrain);
    d->test = *training::LoadFashionMnist(kDataDir, training::Split::kTest);
    return d;
  }();
  return *data;
}

common::v1::TaskSpec Spec(double fetch_probability, uint32_t rounds = 3,
                          uint32_t round_batches = 20, const std::string& model = "mlp") {
  common::v1::TaskSpec spec = task::DefaultTaskSpec();
  spec.set_name("gossip-test");
  spec.set_mode(common::v1::MODE_GOSSIP);
  spec.set_model(model);
  spec.mutable_dataset()->set_train_limit(4000);
  spec.mutable_dataset()->set_test_limit(1000);
  spec.set_batch_size(32);
  spec.set_rounds(rounds);
  spec.set_round_batches(round_batches);
  spec.mutable_gossip()->set_fetch_probability(fetch_probability);
  spec.mutable_gossip()->set_timeout_ms(2000);
  task::ApplyTaskDefaults(spec);
  EXPECT_TRUE(task::ValidateTaskSpec(spec).ok()) << task::ValidateTaskSpec(spec);
  return spec;
}

// A PeerService with its own store and metrics on 127.0.0.1:0.
struct Endpoint {
  prometheus::Registry registry;
  PeerMetrics metrics{registry};
  SnapshotStore store;
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<rpc::Server> server;

  explicit Endpoint(const std::string& id) {
    PeerServiceOptions o;
    o.peer_id = [id] { return id; };
    service = std::make_unique<PeerServiceImpl>(store, metrics, o);
    rpc::ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.service_name = "gossip-test";
    server = *rpc::Server::Start(so, {service.get()});
  }
  std::string address() const { return server->address(); }
};

// A PeerService on 127.0.0.1:0 whose every call fails with `code`: a neighbour shutting down
// (CANCELLED) or broken (INTERNAL). Its failures cost an exchange, never this peer's run.
class FailingEndpoint final : public peer::v1::PeerService::Service {
 public:
  explicit FailingEndpoint(grpc::StatusCode code) : code_(code) {
    rpc::ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.service_name = "gossip-test-failing";
    server_ = *rpc::Server::Start(so, {this});
  }
  ~FailingEndpoint() override { server_->Shutdown(absl::Seconds(1)); }
  grpc::Status GetSnapshot(grpc::ServerContext*, const peer::v1::GetSnapshotRequest*,
                           grpc::ServerWriter<common::v1::ModelChunk>*) override {
    return grpc::Status(code_, "failing on purpose");
  }
  grpc::Status Probe(grpc::ServerContext*, const peer::v1::ProbeRequest*,
                     peer::v1::ProbeResponse*) override {
    return grpc::Status(code_, "failing on purpose");
  }
  std::string address() const { return server_->address(); }

 private:
  const grpc::StatusCode code_;
  std::unique_ptr<rpc::Server> server_;
};

using AfterBatch = std::function<void(const std::function<bool()>& keep_going)>;

// Keeps two peers' training steps within one of each other (through the trainer's after-batch
// hook), so that what a test counts of their exchanges does not depend on how the machine
// schedules their threads: on a loaded machine one peer once ran all its 60 steps (0.1 s)
// before the other began, and fetched nothing. A step waits at most 10 s for the other peer.
class Lockstep {
 public:
  // Peer `peer` (0 or 1)'s hook; it shares the Lockstep.
  static AfterBatch Hook(std::shared_ptr<Lockstep> lockstep, int peer) {
    return [lockstep, peer](const std::function<bool()>& keep_going) {
      lockstep->Stepped(peer, keep_going);
    };
  }

 private:
  void Stepped(int peer, const std::function<bool()>& keep_going) {
    absl::MutexLock lock(&mu_);
    ++steps_[peer];
    const auto level = [this, peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return steps_[1 - peer] + 1 >= steps_[peer];
    };
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!mu_.AwaitWithTimeout(absl::Condition(&level), absl::Milliseconds(100))) {
      if (!keep_going() || absl::Now() > deadline) return;
    }
  }

  absl::Mutex mu_;
  int steps_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
};

// Passes every call on, counting the fetches that came with storage to decode into (a buffer
// the runner kept from an earlier snapshot) and those that came without.
class StorageCountingClient final : public PeerClient {
 public:
  explicit StorageCountingClient(PeerClient& inner) : inner_(inner) {}
  absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address,
                                              const peer::v1::GetSnapshotRequest& request,
                                              absl::Time deadline,
                                              const tensor::ModelLayout& expected,
                                              CallCanceller* canceller,
                                              std::vector<float> buffer) override {
    (buffer.capacity() >= expected.total_elements() ? with_storage_ : without_storage_)++;
    return inner_.Fetch(address, request, deadline, expected, canceller, std::move(buffer));
  }
  absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest& request,
                     absl::Time deadline, CallCanceller* canceller) override {
    return inner_.Probe(address, request, deadline, canceller);
  }
  void Forget(const std::string& address) override { inner_.Forget(address); }
  int with_storage() const { return with_storage_.load(); }
  int without_storage() const { return without_storage_.load(); }

 private:
  PeerClient& inner_;
  std::atomic<int> with_storage_{0};
  std::atomic<int> without_storage_{0};
};

// One gossip peer: endpoint + trainer + client + runner, driven on its own thread like the
// agent's worker. `after_batch`: the trainer's hook (Lockstep).
class Peer {
 public:
  Peer(const std::string& id, const common::v1::TaskSpec& spec, uint32_t shard_index,
       uint32_t shard_count, AfterBatch after_batch = nullptr)
      : id_(id), endpoint_(id), client_(nullptr, &endpoint_.metrics), counting_(client_) {
    training::TrainerOptions o;
    o.spec = spec;
    o.data_dir = kDataDir;
    o.shard = {shard_index, shard_count};
    o.after_batch = std::move(after_batch);
    trainer_ = *training::Trainer::Create(o, SharedData().train, SharedData().test);
    ModeRunnerDeps deps;
    *deps.assigned.mutable_spec() = spec;
    deps.trainer = trainer_.get();
    deps.snapshots = &endpoint_.store;
    deps.peers = &counting_;
    deps.metrics = &endpoint_.metrics;
    deps.clock = &RealClock::Get();
    deps.wakeup = &wakeup_;
    deps.peer_id = id;
    deps.send = [this](const coordinator::v1::PeerMessage& m) {
      absl::MutexLock lock(&mu_);
      sent_.push_back(m);
    };
    auto runner = CreateGossipRunner(std::move(deps));
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }
  // Stops the runner first, so a test that ends early (a failed ASSERT) does not wait for all
  // the steps it asked for.
  ~Peer() {
    Stop();
    Join();
  }

  // Like the agent: Intercept first, then Handle on the worker unless consumed. (An event that
  // is not consumed while the worker runs would wait in the agent's queue; the runner ignores
  // a queued start while it trains, so it is dropped here.)
  void Deliver(const coordinator::v1::CoordinatorEvent& e) {
    if (runner_->Intercept(e)) return;
    {
      absl::MutexLock lock(&mu_);
      if (thread_.joinable() && !returned_) return;
      returned_ = false;
    }
    Join();
    thread_ = std::thread([this, e] {
      runner_->Handle(e, [this] { return keep_going_.load(); });
      absl::MutexLock lock(&mu_);
      returned_ = true;
    });
  }
  void Stop() {
    keep_going_ = false;
    wakeup_.Notify();  // like the agent: whatever turns keep_going false notifies
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool WaitReturned(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return returned_; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  std::vector<coordinator::v1::PeerMessage> sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  // Serves the initial parameters as its LATEST snapshot (clock 0) before it starts, as a peer
  // that is already running would serve its state: a neighbour's first fetch then finds one,
  // however late this peer's first step comes.
  void PublishInitial() {
    Snapshot s;
    s.task = "gossip-test";
    s.kind = peer::v1::SNAPSHOT_KIND_LATEST;
    s.model = std::make_shared<const tensor::FlatModel>(Params());
    endpoint_.store.Publish(std::move(s));
  }
  GossipPeerMetrics& g() { return endpoint_.metrics.gossip; }
  const StorageCountingClient& counting() const { return counting_; }
  PeerMetrics& metrics() { return endpoint_.metrics; }
  std::string address() const { return endpoint_.address(); }
  const std::string& id() const { return id_; }
  tensor::FlatModel Params() { return *trainer_->GetParameters(); }
  training::Trainer& trainer() { return *trainer_; }

 private:
  const std::string id_;
  Endpoint endpoint_;
  GrpcPeerClient client_;
  StorageCountingClient counting_;
  std::unique_ptr<training::Trainer> trainer_;
  rpc::Wakeup wakeup_{RealClock::Get()};
  std::unique_ptr<ModeRunner> runner_;
  std::thread thread_;
  std::atomic<bool> keep_going_{true};
  absl::Mutex mu_;
  std::vector<coordinator::v1::PeerMessage> sent_ ABSL_GUARDED_BY(mu_);
  bool returned_ ABSL_GUARDED_BY(mu_) = false;
};

coordinator::v1::CoordinatorEvent Members(
    const std::vector<std::pair<std::string, std::string>>& members, bool start = true) {
  coordinator::v1::CoordinatorEvent e;
  e.set_task("gossip-test");
  e.mutable_gossip_members()->set_start(start);
  for (const auto& [id, address] : members) {
    auto* p = e.mutable_gossip_members()->add_peers();
    p->set_peer_id(id);
    p->set_address(address);
  }
  return e;
}

double Distance(const tensor::FlatModel& a, const tensor::FlatModel& b) {
  double d = 0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const double x = static_cast<double>(a.values[i]) - b.values[i];
    d += x * x;
  }
  return std::sqrt(d);
}

// Runs two peers to the end; returns the distance between their final models.
double RunPair(double fetch_probability, Peer** out_a = nullptr, Peer** out_b = nullptr,
               std::unique_ptr<Peer>* keep_a = nullptr, std::unique_ptr<Peer>* keep_b = nullptr) {
  const common::v1::TaskSpec spec = Spec(fetch_probability);
  auto lockstep = std::make_shared<Lockstep>();
  auto a = std::make_unique<Peer>("a", spec, 0, 2, Lockstep::Hook(lockstep, 0));
  auto b = std::make_unique<Peer>("b", spec, 1, 2, Lockstep::Hook(lockstep, 1));
  a->PublishInitial();
  b->PublishInitial();
  const auto members = Members({{"a", a->address()}, {"b", b->address()}});
  a->Deliver(members);
  b->Deliver(members);
  EXPECT_TRUE(a->WaitReturned(absl::Seconds(120)));
  EXPECT_TRUE(b->WaitReturned(absl::Seconds(120)));
  const double d = Distance(a->Params(), b->Params());
  if (keep_a) *keep_a = std::move(a);
  if (keep_b) *keep_b = std::move(b);
  return d;
}

TEST(GossipService, TwoPeersExchangeSnapshotsAndConverge) {
  std::unique_ptr<Peer> a, b;
  const double gossip_distance = RunPair(1.0, nullptr, nullptr, &a, &b);
  const double local_distance = RunPair(0.0);
  // Both fetched from each other, and each served the other.
  for (Peer* p : {a.get(), b.get()}) {
    SCOPED_TRACE(p->id());
    EXPECT_GT(p->g().fetches_started.Value(), 10);
    EXPECT_GT(p->g().fetches_succeeded.Value(), 10);
    EXPECT_EQ(p->g().fetches_invalid.Value(), 0);
    EXPECT_GT(p->g().bytes_pulled.Value(), 0);
    // A fetch after a successful one decodes into the storage of the snapshot it brought.
    EXPECT_GE(p->counting().with_storage(), p->g().fetches_succeeded.Value() - 1);
    EXPECT_EQ(p->counting().with_storage() + p->counting().without_storage(),
              p->g().fetches_started.Value());
    EXPECT_GT(p->metrics().snapshots_served.Value(), 10);
    EXPECT_EQ(p->g().steps.Value(), 60);
    // The clock counts steps and is mixed like the parameters: a snapshot taken while the other
    // peer was behind (it started later, or the machine is loaded) pulls it down, so only bounds
    // are checked here; the exact update rules are unit-tested (gossip_interpolation_test).
    EXPECT_GT(p->g().clock.Value(), 15);
    EXPECT_LE(p->g().clock.Value(), 60.001);
    EXPECT_EQ(p->g().score_max.Value(), 1000);
    // GossipProgress after 20 and 40 steps, then done at 60, then the EvalReport.
    std::vector<coordinator::v1::PeerMessage> sent = p->sent();
    ASSERT_EQ(sent.size(), 4u);
    EXPECT_EQ(sent[0].gossip_progress().step(), 20u);
    EXPECT_FALSE(sent[0].gossip_progress().done());
    EXPECT_EQ(sent[1].gossip_progress().step(), 40u);
    EXPECT_EQ(sent[2].gossip_progress().step(), 60u);
    EXPECT_TRUE(sent[2].gossip_progress().done());
    EXPECT_GT(sent[2].gossip_progress().fetches(), 10u);
    EXPECT_GT(sent[2].gossip_progress().bytes_pulled(), 0u);
    ASSERT_TRUE(sent[3].has_eval_report());
    EXPECT_EQ(sent[3].eval_report().version(), 3u);  // rounds
    EXPECT_EQ(sent[3].eval_report().total(), 500u);
    EXPECT_GT(sent[3].eval_report().correct(), 250u);  // well above chance after 60 steps
  }
  // Re-assigned after a reconnect (or a coordinator restart): a finished peer announces its
  // result again, and a new start does not train again.
  coordinator::v1::CoordinatorEvent assigned;
  assigned.mutable_task_assigned()->mutable_spec()->set_name("gossip-test");
  a->Deliver(assigned);
  ASSERT_TRUE(a->WaitReturned(absl::Seconds(10)));
  a->Deliver(Members({{"a", a->address()}, {"b", b->address()}}));
  a->Join();
  std::vector<coordinator::v1::PeerMessage> again = a->sent();
  ASSERT_EQ(again.size(), 6u);
  EXPECT_TRUE(again[4].gossip_progress().done());
  EXPECT_EQ(again[4].gossip_progress().step(), 60u);
  EXPECT_EQ(again[5].eval_report().correct(), again[3].eval_report().correct());
  EXPECT_EQ(a->g().steps.Value(), 60);
  // Gossip pulls the models together; peers that never talk drift apart.
  EXPECT_LT(gossip_distance, 0.5 * local_distance)
      << "gossip " << gossip_distance << " local " << local_distance;
}

TEST(GossipService, BadNeighboursAreRejectedAndDemoted) {
  const common::v1::TaskSpec spec = Spec(1.0, 2, 40);
  Peer good("good", spec, 0, 1);
  // A neighbour serving a model of another layout (a cnn), one serving NaNs, one with no
  // snapshot yet, and an address where nothing listens.
  Endpoint wrong("wrong"), nan("nan"), empty("empty");
  {
    training::TrainerOptions o;
    o.spec = Spec(1.0, 1, 1, "cnn");
    o.data_dir = kDataDir;
    o.shard = {0, 1};
    auto cnn = *training::Trainer::Create(o, SharedData().train, SharedData().test);
    wrong.store.Publish(Snapshot{"gossip-test", 1,
                                 std::make_shared<const tensor::FlatModel>(*cnn->GetParameters())});
    tensor::FlatModel bad = good.Params();
    bad.values[3] = std::nanf("");
    Snapshot s;
    s.task = "gossip-test";
    s.model = std::make_shared<const tensor::FlatModel>(std::move(bad));
    s.clock = 5;
    s.loss = 1;
    nan.store.Publish(s);
  }
  // And two whose calls fail: CANCELLED (as when a neighbour shuts down: it once ended this
  // peer's run silently, as if it had been stopped) and INTERNAL.
  FailingEndpoint cancelled(grpc::StatusCode::CANCELLED), internal(grpc::StatusCode::INTERNAL);
  const auto members = Members({{"good", good.address()},
                                {"wrong", wrong.address()},
                                {"nan", nan.address()},
                                {"empty", empty.address()},
                                {"gone", "127.0.0.1:1"},
                                {"cancelled", cancelled.address()},
                                {"internal", internal.address()}});
  good.Deliver(members);
  ASSERT_TRUE(good.WaitReturned(absl::Seconds(120)));
  // Training went on to the end regardless.
  EXPECT_EQ(good.g().steps.Value(), 80);
  EXPECT_EQ(good.g().fetches_succeeded.Value(), 0);
  EXPECT_GE(good.g().fetches_invalid.Value(), 2);  // both the cnn and the NaN snapshots
  EXPECT_GE(good.metrics().snapshots_rejected.Value(), 2);
  EXPECT_GE(good.g().fetches_no_state.Value(), 1);
  EXPECT_GE(good.g().fetches_refused.Value() + good.g().fetches_timed_out.Value(), 1);
  EXPECT_LT(good.g().score_min.Value(), 1000);  // penalized
  // Demotion keeps failing peers from being asked at every step: far fewer fetches than steps.
  EXPECT_LT(good.g().fetches_started.Value(), 60);
  const auto sent = good.sent();
  ASSERT_FALSE(sent.empty());
  EXPECT_TRUE(sent.back().has_eval_report());
  // The model is intact (never mixed with the NaN snapshot).
  for (float v : good.Params().values) ASSERT_TRUE(std::isfinite(v));
}

// The task's max_update_norm bounds one exchange: a snapshot farther from this model is
// rejected like an invalid one (counted, the peer's score drops) and never mixed in, while a
// near one is.
TEST(GossipService, ASnapshotFartherThanMaxUpdateNormIsRejected) {
  common::v1::TaskSpec spec = Spec(1.0, 2, 20);
  spec.set_max_update_norm(50);
  Peer good("good", spec, 0, 1);
  Endpoint far("far"), near("near");
  const tensor::FlatModel start = good.Params();
  tensor::FlatModel shifted = start;
  for (float& v : shifted.values) v += 1.0f;  // distance sqrt(#parameters), far above 50
  ASSERT_GT(Distance(shifted, start), 100);
  for (auto [endpoint, model] : {std::pair{&far, shifted}, std::pair{&near, start}}) {
    Snapshot s;
    s.task = "gossip-test";
    s.model = std::make_shared<const tensor::FlatModel>(model);
    s.clock = 5;
    s.loss = 1;
    endpoint->store.Publish(s);
  }
  good.Deliver(
      Members({{"good", good.address()}, {"far", far.address()}, {"near", near.address()}}));
  ASSERT_TRUE(good.WaitReturned(absl::Seconds(120)));
  EXPECT_EQ(good.g().steps.Value(), 40);
  EXPECT_GE(good.g().fetches_invalid.Value(), 1);    // far, then demoted
  EXPECT_GE(good.g().fetches_succeeded.Value(), 1);  // near
  EXPECT_LT(good.g().score_min.Value(), 1000);       // far's score dropped
  EXPECT_LE(good.g().peer_distance.Value(), 50);     // every exchange that went through
  // Never mixed with the far snapshot: still about as far from it as at the start.
  EXPECT_GT(Distance(good.Params(), shifted), 50);
}

TEST(GossipService, WaitsForStartAndStopsPromptly) {
  const common::v1::TaskSpec spec = Spec(1.0, 1000, 100);  // far more steps than we let it run
  Peer a("a", spec, 0, 2);
  Peer b("b", spec, 1, 2);
  // Members without start: consumed, nothing trains.
  a.Deliver(Members({{"a", a.address()}, {"b", b.address()}}, /*start=*/false));
  // Checking that nothing happens: a wait with no condition to wait for. A peer that wrongly
  // started would have stepped within this time on any machine (steps take milliseconds).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(a.g().steps.Value(), 0);
  EXPECT_EQ(a.g().peers.Value(), 0);
  const auto members = Members({{"a", a.address()}, {"b", b.address()}});
  a.Deliver(members);
  b.Deliver(members);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((a.g().fetches_succeeded.Value() < 3 || b.g().fetches_succeeded.Value() < 3) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(a.g().fetches_succeeded.Value(), 3);
  // A membership update while training applies at once (consumed by Intercept): b is gone.
  coordinator::v1::CoordinatorEvent alone = Members({{"a", a.address()}});
  a.Deliver(alone);
  const double succeeded = a.g().fetches_succeeded.Value();
  const double steps = a.g().steps.Value();
  while (a.g().steps.Value() < steps + 30 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(a.g().peers.Value(), 0);
  EXPECT_LE(a.g().fetches_succeeded.Value(), succeeded + 1);  // at most the one in flight
  // Stop: both return promptly, without sending done.
  const absl::Time stop = absl::Now();
  a.Stop();
  b.Stop();
  // Promptly means within a step or a fetch, not after the ~1000 steps asked for; the bound is
  // loose so that a loaded machine (or a sanitizer build) does not fail it.
  EXPECT_TRUE(a.WaitReturned(absl::Seconds(30)));
  EXPECT_TRUE(b.WaitReturned(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - stop, absl::Seconds(30));
  for (const auto& m : a.sent()) EXPECT_FALSE(m.gossip_progress().done());
}

}  // namespace
}  // namespace shoal::peer
