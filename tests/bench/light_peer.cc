#include "tests/bench/light_peer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/tensor/frame_codec.h"
#include "tests/bench/secure_light.h"

namespace shoal::bench {

namespace v1 = coordinator::v1;

namespace {
enum EventKind { kStarted = 0, kPushed = 1, kPublished = 2, kDownloaded = 3 };
}  // namespace

// One session (a SessionLink: gRPC, or the coordinator's core called directly). Reactions never
// block: aggregator calls go to the fleet's executor.
class LightPeer {
 public:
  LightPeer(Fleet& fleet, int index)
      : fleet_(fleet),
        index_(index),
        aggregator_(*fleet.aggregators_[static_cast<size_t>(index) % fleet.aggregators_.size()]) {
    LinkCallbacks callbacks{[this](const v1::CoordinatorEvent& e) { Handle(e); },
                            [this](const absl::Status& status) { Done(status); }};
    const Fleet::Options& o = fleet.options_;
    if (o.secure) {
      absl::StatusOr<LightIdentity> identity = MakeLightIdentity();
      if (identity.ok()) {
        identity_ = *std::move(identity);
      } else {  // its Hello has no key: the coordinator leaves it out of the rounds
        ++fleet.errors_.calls_failed;
        std::fprintf(stderr, "light-%d: identity key: %s\n", index,
                     std::string(identity.status().message()).c_str());
      }
    }
    if (o.core != nullptr) {
      link_ = MakeDirectLink(*o.core, *fleet.delivery_, &fleet.errors_.events_lost,
                             std::move(callbacks));
      return;
    }
    if (o.channel != nullptr) {  // in-process: every session on the one channel
      link_ = MakeGrpcLink(o.channel, std::move(callbacks));
      return;
    }
    grpc::ChannelArguments args;
    // One TCP connection per peer, as separate processes would have (channels with equal
    // arguments otherwise share one subchannel, hence one connection).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    link_ = MakeGrpcLink(
        grpc::CreateCustomChannel(
            o.coordinator,
            o.credentials != nullptr ? o.credentials : grpc::InsecureChannelCredentials(), args),
        std::move(callbacks));
  }

  void Start() {
    v1::PeerMessage hello;
    hello.mutable_hello()->set_name(absl::StrCat(fleet_.options_.name_prefix, "-", index_));
    hello.mutable_hello()->set_listen_address("127.0.0.1:1");
    hello.mutable_hello()->set_device("cpu");
    hello.mutable_hello()->set_shard_index(static_cast<uint32_t>(index_));
    hello.mutable_hello()->set_shard_count(static_cast<uint32_t>(fleet_.options_.peers));
    hello.mutable_hello()->set_identity_public_key(identity_.public_key);
    link_->Start(std::move(hello));
  }

  // No message is sent from outside the link's callbacks any more (the fleet stopped its
  // heartbeats and executor).
  void Stop() { link_->Stop(); }
  void WaitDone() { link_->WaitDone(); }

  void Heartbeat() {
    {
      absl::MutexLock lock(&mu_);
      if (peer_id_.empty()) return;
    }
    v1::PeerMessage beat;
    beat.mutable_heartbeat();
    Send(std::move(beat));
    ++fleet_.heartbeats_;
  }

 private:
  void Done(const absl::Status& status) {
    if (fleet_.stopping_.load()) return;
    ++fleet_.errors_.streams_broken;
    std::fprintf(stderr, "light-%d: session ended: %s\n", index_,
                 std::string(status.message()).c_str());
  }

  void Send(v1::PeerMessage message) { link_->Send(std::move(message)); }

  aggregator::Caller Me() {
    absl::MutexLock lock(&mu_);
    return {peer_id_, session_token_};
  }

  void Handle(const v1::CoordinatorEvent& e) {
    switch (e.kind_case()) {
      case v1::CoordinatorEvent::kWelcome: {
        absl::MutexLock lock(&mu_);
        peer_id_ = e.welcome().peer_id();
        session_token_ = e.welcome().session_token();
        ++fleet_.welcomed_;
        break;
      }
      case v1::CoordinatorEvent::kTaskAssigned: {
        absl::MutexLock lock(&mu_);
        aggregator_address_ = e.task_assigned().aggregator_address();
        ++fleet_.assigned_;
        break;
      }
      case v1::CoordinatorEvent::kInitializeModel:
        Submit([this, task = e.task(), to = e.initialize_model().aggregator_address(),
                version = e.initialize_model().version()] { PutInitialModel(task, to, version); });
        break;
      case v1::CoordinatorEvent::kRoundStarted:
        fleet_.Record(e.round_started().round(), kStarted, fleet_.Now());
        Submit([this, task = e.task(), r = e.round_started()] {
          if (fleet_.options_.download && !Download(task, r.model_version())) return;
          if (fleet_.options_.secure) {
            SecurePush(task, r);
          } else {
            PushUpdate(task, r);
          }
        });
        break;
      case v1::CoordinatorEvent::kModelPublished: {
        const v1::ModelPublished& p = e.model_published();
        fleet_.Record(p.round(), kPublished, fleet_.Now());
        if (!fleet_.options_.download) {
          Evaluated(e.task(), p.version());
          break;
        }
        Submit([this, task = e.task(), p] {
          if (!Download(task, p.version())) return;
          fleet_.Record(p.round(), kDownloaded, fleet_.Now());
          Evaluated(task, p.version());
        });
        break;
      }
      default:
        break;
    }
  }

  void Evaluated(const std::string& task, uint64_t version) {
    v1::PeerMessage report;
    auto* r = report.mutable_eval_report();
    report.set_task(task);
    r->set_version(version);
    r->set_correct(7);
    r->set_total(10);
    r->set_loss_sum(5.0);
    Send(std::move(report));
  }

  // Pulls model `version` unless this peer holds it (one download at a time per peer).
  bool Download(const std::string& task, uint64_t version) {
    absl::MutexLock lock(&download_mu_);
    if (held_ == version) return true;
    const std::string address = Aggregator();
    const aggregator::Caller me = Me();
    if (!CallWithRetry("GetModel", [&](absl::Time deadline) {
          return aggregator_
              .GetModelInto(
                  address, task, version, me, deadline,
                  [](size_t, absl::Span<const float>) { return absl::OkStatus(); },
                  /*held=*/nullptr)
              .status();
        })) {
      return false;
    }
    held_ = version;
    return true;
  }

  void Submit(std::function<void()> fn) {
    // Refused work after Stop() began is the end of the run, not an error.
    if (!fleet_.calls_.TrySubmit(std::move(fn)) && !fleet_.stopping_.load()) {
      ++fleet_.errors_.rejected;
    }
  }

  std::string Aggregator() {
    absl::MutexLock lock(&mu_);
    return aggregator_address_;
  }

  // Retries what the aggregator asks to retry (back-pressure, a round not open yet) like a peer.
  template <typename Fn>
  bool CallWithRetry(const char* what, Fn fn) {
    const absl::Time give_up = absl::Now() + fleet_.options_.call_budget;
    absl::Duration backoff = absl::Milliseconds(5);
    while (!fleet_.stopping_.load()) {
      absl::Status s = fn(absl::Now() + fleet_.options_.call_timeout);
      if (s.ok()) return true;
      const bool retry = absl::IsResourceExhausted(s) || absl::IsUnavailable(s);
      if (!retry || absl::Now() > give_up) {
        ++fleet_.errors_.calls_failed;
        std::fprintf(stderr, "light-%d: %s: %s\n", index_, what, std::string(s.message()).c_str());
        return false;
      }
      ++fleet_.push_retries_;
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
      backoff = std::min(backoff * 2, absl::Milliseconds(200));
    }
    return false;
  }

  // To `to` when set (a hierarchical task's root), else to the task's aggregator.
  void PutInitialModel(const std::string& task, const std::string& to, uint64_t version) {
    const common::v1::ModelMeta meta = tensor::MakeModelMeta(task, version, *fleet_.model_);
    const std::string address = to.empty() ? Aggregator() : to;
    const aggregator::Caller me = Me();
    if (!CallWithRetry("PutModel", [&](absl::Time deadline) {
          return aggregator_
              .PutModel(address, meta, shoal::tensor::EncodeRaw(fleet_.model_), me, deadline)
              .status();
        })) {
      return;
    }
    {
      absl::MutexLock lock(&download_mu_);
      held_ = version;
    }
    v1::PeerMessage done;
    done.set_task(task);
    done.mutable_model_initialized()->set_digest_xxh3(fleet_.model_->Digest());
    Send(std::move(done));
  }

  void PushUpdate(const std::string& task, const v1::RoundStarted& r) {
    aggregator::v1::UpdateMeta meta;
    const aggregator::Caller me = Me();
    meta.set_task(task);
    meta.set_round(r.round());
    meta.set_peer_id(me.peer_id);
    meta.set_session_token(me.session_token);
    meta.set_base_version(r.model_version());
    meta.set_num_samples(32);
    meta.set_train_loss(0.5);
    const std::string address = Aggregator();
    // The trivial update: the model itself as a delta (small and finite).
    const std::shared_ptr<const tensor::EncodedModel> update = tensor::EncodeRaw(fleet_.model_);
    if (!CallWithRetry("PushUpdate", [&](absl::Time deadline) {
          return aggregator_.PushUpdate(address, meta, update, deadline).status();
        })) {
      return;
    }
    fleet_.Record(r.round(), kPushed, fleet_.Now());
    ++fleet_.update_calls_;
    fleet_.update_bytes_sent_ +=
        static_cast<int64_t>(meta.ByteSizeLong() + update->payload_bytes());
  }

  // The round's SecAgg+ exchange, as shoal-peer's SecurePush: pushed when the masked update is
  // sent. One call, no retry (a peer that misses a step is out of the round).
  void SecurePush(const std::string& task, const v1::RoundStarted& r) {
    const aggregator::Caller me = Me();
    aggregator::SecureContribution contribution;
    contribution.peer_id = me.peer_id;
    contribution.signer = identity_.signer;
    contribution.identity_keys.insert(r.identity_keys().begin(), r.identity_keys().end());
    contribution.base_version = r.model_version();
    // The model itself as the delta, read in place; the masked values' buffer kept across rounds.
    contribution.update_view = fleet_.model_->values;
    aggregator::SecureBuffers buffers;
    {
      absl::MutexLock lock(&mu_);
      buffers = std::move(secure_buffers_);
    }
    contribution.buffers = &buffers;
    contribution.num_samples = 32;
    contribution.train_loss = 0.5;
    const bool drop = index_ < fleet_.dropping_;
    BenchSecureParty party(std::move(contribution), drop,
                           [&] { fleet_.Record(r.round(), kPushed, fleet_.Now()); });
    const absl::Status s = aggregator_.SecureAggregate(
        Aggregator(), task, r.round(), me, party, absl::Now() + fleet_.options_.secure_timeout);
    ++fleet_.update_calls_;
    fleet_.update_bytes_sent_ += party.bytes_sent();
    fleet_.update_bytes_received_ += party.bytes_received();
    for (int step = 0; step < BenchSecureParty::kSteps; ++step) {
      fleet_.secure_step_us_[step] += party.cpu_us()[step];
    }
    {
      absl::MutexLock lock(&mu_);
      secure_buffers_ = std::move(buffers);
    }
    if (!s.ok() && !party.dropped() && !fleet_.stopping_.load()) {
      ++fleet_.errors_.calls_failed;
      std::fprintf(stderr, "light-%d: SecureAggregate: %s\n", index_,
                   std::string(s.message()).c_str());
    }
  }

  Fleet& fleet_;
  const int index_;
  aggregator::AggregatorClient& aggregator_;  // one of the fleet's (Fleet::aggregators_)
  std::unique_ptr<SessionLink> link_;
  LightIdentity identity_;  // Options::secure

  absl::Mutex mu_;
  std::string peer_id_ ABSL_GUARDED_BY(mu_);
  std::string session_token_ ABSL_GUARDED_BY(mu_);
  // Options::secure: kept from round to round; a round takes them while it runs.
  aggregator::SecureBuffers secure_buffers_ ABSL_GUARDED_BY(mu_);
  std::string aggregator_address_ ABSL_GUARDED_BY(mu_);
  absl::Mutex download_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t held_ ABSL_GUARDED_BY(download_mu_) = ~uint64_t{0};  // the model version held
};

Fleet::Fleet(Options options)
    : options_(std::move(options)),
      dropping_(options_.secure
                    ? static_cast<int>(std::lround(options_.drop_after_masking * options_.peers))
                    : 0),
      epoch_(std::chrono::steady_clock::now()),
      calls_(options_.secure ? std::max(options_.call_threads, static_cast<size_t>(options_.peers))
                             : options_.call_threads,
             static_cast<size_t>(options_.peers) * 4) {
  if (options_.core != nullptr) {
    // Room for a few events per peer in flight (a broadcast posts one per peer).
    delivery_ = std::make_unique<ThreadPool>(1, static_cast<size_t>(options_.peers) * 8);
  }
  auto model = std::make_shared<tensor::FlatModel>();
  model->layout = *tensor::ModelLayout::Create({{"w", {options_.model_floats}}});
  model->values.assign(static_cast<size_t>(options_.model_floats), 0.01f);
  model_ = std::move(model);
  for (int i = 0; i < std::min(options_.peers, kAggregatorConnections); ++i) {
    aggregators_.push_back(std::make_unique<aggregator::GrpcAggregatorClient>(
        options_.credentials, rpc::Connection::kOwn));
  }
  for (int i = 0; i < options_.peers; ++i) peers_.push_back(std::make_unique<LightPeer>(*this, i));
}

Fleet::~Fleet() { Stop(); }

void Fleet::Start() {
  // Heartbeats first: each peer beats once welcomed, as a real one does, even while later
  // sessions are still being started (10,000 starts take seconds).
  beat_thread_ = std::thread([this] { HeartbeatLoop(); });
  if (options_.join_rate <= 0) {
    for (auto& p : peers_) p->Start();
  } else {
    join_thread_ = std::thread([this] {
      const double start = Now();
      for (size_t i = 0; i < peers_.size(); ++i) {
        const double due = start + static_cast<double>(i) / options_.join_rate;
        // Sleeps at most 100 ms at a time, so that Stop is not kept waiting.
        while (!stopping_.load() && Now() < due) {
          absl::SleepFor(absl::Seconds(std::min(due - Now(), 0.1)));
        }
        if (stopping_.load()) return;
        peers_[i]->Start();
      }
    });
  }
}

void Fleet::Stop() {
  if (stopping_.exchange(true)) return;
  {
    absl::MutexLock lock(&beat_mu_);
    beat_stop_ = true;
  }
  if (beat_thread_.joinable()) beat_thread_.join();
  if (join_thread_.joinable()) join_thread_.join();  // no session starts after this
  calls_.Shutdown();
  for (auto& p : peers_) p->Stop();
  for (auto& p : peers_) p->WaitDone();
  if (delivery_ != nullptr) delivery_->Shutdown();
}

double Fleet::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

void Fleet::Record(uint64_t round, int kind, double t) {
  absl::MutexLock lock(&mu_);
  RoundTimes& r = rounds_[round];
  (kind == kStarted     ? r.started
   : kind == kPushed    ? r.pushed
   : kind == kPublished ? r.published
                        : r.downloaded)
      .push_back(t);
}

std::map<uint64_t, RoundTimes> Fleet::Rounds() const {
  absl::MutexLock lock(&mu_);
  return rounds_;
}

int Fleet::CompleteRounds() const {
  const size_t n = static_cast<size_t>(options_.peers);
  absl::MutexLock lock(&mu_);
  int complete = 0;
  for (const auto& [round, t] : rounds_) {
    if (t.started.size() == n && t.pushed.size() == n && t.published.size() == n) ++complete;
  }
  return complete;
}

// Peer i beats at offset i/N of the interval, so beats arrive evenly, as from independent peers.
void Fleet::HeartbeatLoop() {
  const double interval = absl::ToDoubleSeconds(options_.heartbeat_interval);
  const int n = static_cast<int>(peers_.size());
  std::vector<double> next(peers_.size());
  const double start = Now();
  for (int i = 0; i < n; ++i) next[i] = start + interval * i / n;
  absl::MutexLock lock(&beat_mu_);
  while (!beat_mu_.AwaitWithTimeout(absl::Condition(&beat_stop_), absl::Milliseconds(10))) {
    beat_mu_.Unlock();
    const double now = Now();
    for (int i = 0; i < n; ++i) {
      if (next[i] > now) continue;
      peers_[i]->Heartbeat();
      next[i] += interval;
    }
    beat_mu_.Lock();
  }
}

}  // namespace shoal::bench
