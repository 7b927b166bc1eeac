#include "services/peer_agent/modes/gossip/gossip_runner.h"

#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/gossip/flow_control.h"
#include "libs/gossip/gossip_spec.h"
#include "libs/gossip/interpolation.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/reports.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

// How long Wait() goes without re-checking keep_going by itself (a finished fetch and whatever
// changes keep_going notify the wakeup; this is only a safety net).
constexpr absl::Duration kGossipRecheck = absl::Seconds(1);

// Runs one snapshot fetch at a time on a thread of its own, so that it overlaps the training
// step; a finished fetch notifies the wakeup. Owned by the runner; Start/Wait/Cancel from the
// runner's worker thread only.
class AsyncFetcher {
 public:
  struct Job {
    std::string peer_id;
    std::string address;
    peer::v1::GetSnapshotRequest request;
    absl::Time deadline;
    tensor::ModelLayout layout;
    std::vector<float> buffer;  // storage the snapshot decodes into (PeerClient::Fetch)
  };
  struct Result {
    std::string peer_id;
    absl::StatusOr<tensor::ReceivedModel> model = absl::UnknownError("not run");
    absl::Duration took;
    bool cancelled = false;  // we cancelled it (stop): not the peer's fault
  };

  AsyncFetcher(PeerClient* client, const Clock* clock, rpc::Wakeup* wakeup)
      : client_(client), clock_(clock), wakeup_(wakeup), thread_([this] { Loop(); }) {}

  ~AsyncFetcher() {
    std::shared_ptr<CallCanceller> canceller;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      canceller = canceller_;
    }
    if (canceller) canceller->Cancel();
    thread_.join();
  }

  // Starts `job`; the previous result must have been collected with Wait().
  void Start(Job job) {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
    result_.reset();
    canceller_ = std::make_shared<CallCanceller>();
  }

  // Waits for the running fetch. When `keep_going` turns false the fetch is cancelled (its
  // result is then CANCELLED, or whatever arrived first).
  Result Wait(const std::function<bool()>& keep_going) {
    bool cancelled = false;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (result_.has_value()) {
          Result r = std::move(*result_);
          result_.reset();
          r.cancelled = cancelled;
          return r;
        }
      }
      if (!cancelled && keep_going && !keep_going()) {
        cancelled = true;
        Cancel();
      }
      wakeup_->SleepFor(kGossipRecheck,
                        [&] { return !HasResult() && (cancelled || !keep_going || keep_going()); });
    }
  }

  bool HasResult() {
    absl::MutexLock lock(&mu_);
    return result_.has_value();
  }

  void Cancel() {
    std::shared_ptr<CallCanceller> canceller;
    {
      absl::MutexLock lock(&mu_);
      canceller = canceller_;
    }
    if (canceller) canceller->Cancel();
  }

 private:
  void Loop() {
    while (true) {
      Job job;
      std::shared_ptr<CallCanceller> canceller;
      {
        absl::MutexLock lock(&mu_);
        auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || job_.has_value();
        };
        mu_.Await(absl::Condition(&has_work));
        if (stop_) return;
        job = std::move(*job_);
        job_.reset();
        canceller = canceller_;
      }
      const absl::Time start = clock_->Now();
      Result r;
      r.peer_id = job.peer_id;
      r.model = client_->Fetch(job.address, job.request, job.deadline, job.layout, canceller.get(),
                               std::move(job.buffer));
      r.took = clock_->Now() - start;
      {
        absl::MutexLock lock(&mu_);
        result_ = std::move(r);
      }
      wakeup_->Notify();
    }
  }

  PeerClient* const client_;
  const Clock* const clock_;
  rpc::Wakeup* const wakeup_;
  absl::Mutex mu_;
  std::optional<Job> job_ ABSL_GUARDED_BY(mu_);
  std::optional<Result> result_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CallCanceller> canceller_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started after the members above exist
};

gossip::FetchOutcome OutcomeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return gossip::FetchOutcome::kSuccess;
    case absl::StatusCode::kDeadlineExceeded:
      return gossip::FetchOutcome::kTimeout;
    case absl::StatusCode::kNotFound:
      return gossip::FetchOutcome::kNoState;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
      return gossip::FetchOutcome::kInvalid;
    default:  // UNAVAILABLE (refused), FAILED_PRECONDITION, INTERNAL, ...
      return gossip::FetchOutcome::kRefused;
  }
}

// The gossip runner (see gossip_runner.h). Threading: Intercept() on the session reader thread
// (only touches the members under mu_); everything else on the agent's worker thread, plus the
// fetcher's own thread inside AsyncFetcher.
class GossipRunner final : public ModeRunner {
 public:
  explicit GossipRunner(ModeRunnerDeps deps)
      : d_(std::move(deps)),
        spec_(d_.assigned.spec()),
        config_(gossip::ResolveGossipSpec(spec_.gossip())),
        total_steps_(static_cast<uint64_t>(spec_.rounds()) * spec_.round_batches()),
        flow_(config_.flow_control, Seed(spec_.seed(), d_.peer_id)),
        rng_(Seed(spec_.seed(), d_.peer_id) ^ 0x9e3779b97f4a7c15ULL),
        fetcher_(d_.peers, d_.clock, d_.wakeup) {}

  ~GossipRunner() override { d_.metrics->gossip.peers.Set(0); }

  bool Intercept(const CoordinatorEvent& event) override {
    if (!event.has_gossip_members() || event.task() != spec_.name()) {
      return false;
    }
    absl::MutexLock lock(&mu_);
    members_.assign(event.gossip_members().peers().begin(), event.gossip_members().peers().end());
    ++members_version_;
    // A start (sent again at every membership change) is queued so that a stopped loop
    // resumes (e.g. after a reconnect); Handle() ignores it while nothing is left to do.
    return !event.gossip_members().start() || finished_;
  }

  void Handle(const CoordinatorEvent& event, const std::function<bool()>& keep_going) override {
    if (event.has_task_assigned()) {
      // Re-assigned after a reconnect or a coordinator restart: a finished peer announces its
      // result again (the coordinator may have forgotten it); an unfinished one resumes at the
      // next GossipMembers{start}.
      bool finished;
      {
        absl::MutexLock lock(&mu_);
        finished = finished_;
      }
      if (finished) {
        for (const PeerMessage& m : final_messages_) Send(m);
      }
      return;
    }
    if (!event.has_gossip_members() || event.task() != spec_.name()) return;
    {
      absl::MutexLock lock(&mu_);
      // Queued before this runner existed (so Intercept never saw it): apply it now.
      if (members_version_ == 0) {
        members_.assign(event.gossip_members().peers().begin(),
                        event.gossip_members().peers().end());
        ++members_version_;
      }
      if (finished_) return;
    }
    if (event.gossip_members().start()) Run(keep_going);
  }

 private:
  static uint64_t Seed(uint64_t task_seed, const std::string& peer_id) {
    return task_seed * 0x100000001b3ULL ^ std::hash<std::string>()(peer_id);
  }

  void Send(PeerMessage m) {
    if (d_.send) d_.send(m);
  }

  // Worker: applies the latest membership to the flow control.
  void ApplyMembers() {
    std::vector<coordinator::v1::PeerEndpoint> members;
    {
      absl::MutexLock lock(&mu_);
      if (members_version_ == applied_members_version_) return;
      applied_members_version_ = members_version_;
      members = members_;
    }
    std::vector<std::string> ids;
    std::map<std::string, std::string> addresses;
    for (const auto& m : members) {
      if (m.peer_id() == d_.peer_id || m.peer_id().empty() || m.address().empty()) continue;
      ids.push_back(m.peer_id());
      addresses[m.peer_id()] = m.address();
    }
    for (const auto& [id, address] : addresses_) {
      auto it = addresses.find(id);
      if (it == addresses.end() || it->second != address) d_.peers->Forget(address);
    }
    addresses_ = std::move(addresses);
    flow_.SetPeers(ids);
    LogInfo("gossip ", spec_.name(), ": ", ids.size(), " other member(s)");
    UpdateScoreMetrics();
  }

  void UpdateScoreMetrics() {
    gossip::FlowControl::Summary s = flow_.Summarize(d_.clock->Now());
    GossipPeerMetrics& g = d_.metrics->gossip;
    g.peers.Set(static_cast<double>(s.peers));
    g.peers_demoted.Set(static_cast<double>(s.demoted));
    g.score_min.Set(s.min);
    g.score_mean.Set(s.mean);
    g.score_max.Set(s.max);
  }

  absl::StatusOr<tensor::FlatModel> GetState() const {
    return d_.trainer->GetState(config_.include_buffers);
  }

  void Publish(std::shared_ptr<const tensor::FlatModel> model) {
    Snapshot s;
    s.task = spec_.name();
    s.version = step_;
    s.model = std::move(model);
    s.kind = peer::v1::SNAPSHOT_KIND_LATEST;
    s.clock = clock_;
    s.loss = loss_;
    d_.snapshots->Publish(std::move(s));
  }

  void Run(const std::function<bool()>& keep_going) {
    if (!started_) {
      started_ = true;
      LogInfo("gossip ", spec_.name(), ": starting ", total_steps_, " steps (fetch_probability ",
              config_.fetch_probability, ", timeout ", absl::FormatDuration(config_.timeout), ")");
    }
    while (step_ < total_steps_) {
      if (keep_going && !keep_going()) return;
      ApplyMembers();
      absl::Status s = Step(keep_going);
      if (s.code() == absl::StatusCode::kCancelled) return;
      if (!s.ok()) {
        LogError("gossip ", spec_.name(), ": ", s.message());
        Send(MakePeerError(0, s));
        absl::MutexLock lock(&mu_);
        finished_ = true;
        return;
      }
      if (step_ % spec_.round_batches() == 0 && step_ < total_steps_) SendProgress(false);
    }
    Finish();
  }

  void SendProgress(bool done) {
    PeerMessage m;
    auto& p = *m.mutable_gossip_progress();
    p.set_step(step_);
    p.set_clock(clock_);
    p.set_loss(losses_since_report_ == 0 ? loss_ : loss_sum_since_report_ / losses_since_report_);
    p.set_done(done);
    p.set_fetches(fetches_ok_);
    p.set_bytes_pulled(bytes_pulled_);
    loss_sum_since_report_ = 0;
    losses_since_report_ = 0;
    if (done) final_messages_.push_back(m);
    Send(m);
  }

  void Finish() {
    // The final model stays served for peers still training.
    absl::StatusOr<tensor::FlatModel> state = GetState();
    if (state.ok()) Publish(std::make_shared<const tensor::FlatModel>(*std::move(state)));
    SendProgress(true);
    absl::StatusOr<training::EvalStats> eval = d_.trainer->Evaluate();
    if (eval.ok()) {
      d_.metrics->test_accuracy.Set(eval->accuracy());
      LogInfo("gossip ", spec_.name(), ": done after ", step_, " steps, clock ", clock_,
              ", test accuracy ", eval->accuracy(), " (", eval->total, " samples), ", fetches_ok_,
              " fetches, ", bytes_pulled_, " bytes pulled");
      PeerMessage m = MakeEvalReport(spec_.rounds(), *eval);
      final_messages_.push_back(m);
      Send(m);
    } else {
      LogError("gossip ", spec_.name(), ": evaluation failed: ", eval.status().message());
      Send(MakePeerError(0, eval.status()));
    }
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  // One dpwa step: publish -> maybe start a fetch -> train one batch -> wait -> interpolate.
  absl::Status Step(const std::function<bool()>& keep_going) {
    absl::StatusOr<tensor::FlatModel> state = GetState();
    if (!state.ok()) return state.status();
    auto before = std::make_shared<const tensor::FlatModel>(*std::move(state));
    Publish(before);
    const double clock_before = clock_;

    bool fetching = false;
    if (config_.fetch_probability > 0 &&
        (config_.fetch_probability >= 1 || coin_(rng_) < config_.fetch_probability)) {
      const absl::Time now = d_.clock->Now();
      if (std::optional<std::string> peer = flow_.Choose(now)) {
        AsyncFetcher::Job job;
        job.peer_id = *peer;
        job.address = addresses_[*peer];
        job.request.set_task(spec_.name());
        job.request.set_kind(peer::v1::SNAPSHOT_KIND_LATEST);
        job.request.set_peer_id(d_.peer_id);
        job.deadline = now + config_.timeout;
        job.layout = before->layout;
        job.buffer = std::move(spare_);
        fetcher_.Start(std::move(job));
        fetching = true;
        d_.metrics->gossip.fetches_started.Increment();
      }
    }

    absl::StatusOr<training::TrainStats> stats = d_.trainer->TrainBatches(1, keep_going);
    if (!stats.ok()) {
      if (fetching) {
        fetcher_.Cancel();
        fetcher_.Wait(nullptr);
      }
      return stats.status();
    }
    ++step_;
    clock_ += 1;
    loss_ = stats->mean_loss;
    loss_sum_since_report_ += stats->mean_loss;
    ++losses_since_report_;
    d_.metrics->gossip.steps.Increment();
    d_.metrics->samples_trained.Increment(static_cast<double>(stats->samples));
    d_.metrics->train_loss.Set(loss_);

    if (fetching) {
      const absl::Time wait_start = d_.clock->Now();
      AsyncFetcher::Result r = fetcher_.Wait(keep_going);
      d_.metrics->gossip.wait_duration.Observe(absl::ToDoubleSeconds(d_.clock->Now() - wait_start));
      absl::Status mixed = Mix(r, *before, clock_before);
      if (mixed.code() == absl::StatusCode::kCancelled) return mixed;
      if (!mixed.ok() && mixed.code() != absl::StatusCode::kInternal) {
        // A bad or missing snapshot costs this exchange only.
      } else if (!mixed.ok()) {
        return mixed;  // local failure (reading or setting our own parameters)
      }
      UpdateScoreMetrics();
    }
    d_.metrics->gossip.clock.Set(clock_);
    return absl::OkStatus();
  }

  // Applies a fetch result: interpolates on success, records the outcome. Returns CANCELLED
  // when the fetch was cancelled (stop), INTERNAL for local failures, other errors for the
  // peer's fault (already recorded).
  absl::Status Mix(AsyncFetcher::Result& r, const tensor::FlatModel& before, double clock_before) {
    GossipPeerMetrics& g = d_.metrics->gossip;
    const absl::Time now = d_.clock->Now();
    if (!r.model.ok()) {
      const absl::Status& s = r.model.status();
      if (r.cancelled) return absl::CancelledError(s.message());
      // CANCELLED from the other side (e.g. it is shutting down) is the peer's failure.
      const gossip::FetchOutcome outcome = OutcomeOf(s);
      flow_.Record(r.peer_id, outcome, now);
      switch (outcome) {
        case gossip::FetchOutcome::kTimeout:
          g.fetches_timed_out.Increment();
          break;
        case gossip::FetchOutcome::kNoState:
          g.fetches_no_state.Increment();
          break;
        case gossip::FetchOutcome::kInvalid:
          g.fetches_invalid.Increment();
          LogWarning("gossip ", spec_.name(), ": rejected the snapshot of ", r.peer_id, ": ",
                     s.message());
          break;
        default:
          g.fetches_refused.Increment();
          break;
      }
      // This exchange failed, whatever the code: the other side's CANCELLED (it is shutting
      // down) or INTERNAL must not read as our own stop or our own failure.
      return absl::UnavailableError(absl::StrCat("fetch from ", r.peer_id, ": ", s.message()));
    }
    const tensor::ReceivedModel& got = *r.model;
    // Whatever comes of it, the snapshot's storage takes the next fetch: a fresh model-sized
    // buffer costs the first touch of each of its pages at every exchange.
    absl::Cleanup keep_storage = [&] { spare_ = std::move(r.model->model.values); };
    absl::StatusOr<double> f =
        gossip::InterpolationFactor(config_, {clock_, loss_}, {got.meta.clock(), got.meta.loss()});
    if (f.ok() && got.model.values.size() != before.values.size()) {
      f = absl::InvalidArgumentError("snapshot size differs from this model");
    }
    if (!f.ok()) {
      flow_.Record(r.peer_id, gossip::FetchOutcome::kInvalid, now);
      g.fetches_invalid.Increment();
      LogWarning("gossip ", spec_.name(), ": rejected the snapshot of ", r.peer_id, ": ",
                 f.status().message());
      return absl::InvalidArgumentError(f.status().message());
    }
    absl::StatusOr<tensor::FlatModel> after = GetState();
    if (!after.ok()) return absl::InternalError(after.status().message());
    double distance = 0;
    for (size_t i = 0; i < after->values.size(); ++i) {
      const double d = static_cast<double>(after->values[i]) - got.model.values[i];
      distance += d * d;
    }
    distance = std::sqrt(distance);
    // The task's max_update_norm bounds how far one exchange may move this model: a snapshot
    // farther away is treated like any other invalid one.
    if (const double bound = spec_.max_update_norm(); bound > 0 && !(distance <= bound)) {
      flow_.Record(r.peer_id, gossip::FetchOutcome::kInvalid, now);
      g.fetches_invalid.Increment();
      const std::string why =
          absl::StrCat("its distance ", distance, " to this model exceeds max_update_norm ", bound);
      LogWarning("gossip ", spec_.name(), ": rejected the snapshot of ", r.peer_id, ": ", why);
      return absl::InvalidArgumentError(why);
    }
    absl::Status s = config_.mix_post_step
                         ? gossip::Interpolate(*f, got.model.values, absl::MakeSpan(after->values))
                         : gossip::InterpolateKeepingStep(*f, got.model.values, before.values,
                                                          absl::MakeSpan(after->values));
    if (!s.ok()) return absl::InternalError(s.message());
    if (*f > 0) {
      s = d_.trainer->SetState(*after);
      if (!s.ok()) return absl::InternalError(s.message());
    }
    // The clock follows the parameters' mixing order: dpwa's mixes the post-step clock; Shoal's
    // mixes the clock the fetch started from and keeps this step (+1), so it still counts steps.
    clock_ = config_.mix_post_step ? gossip::InterpolateClock(*f, clock_, got.meta.clock())
                                   : gossip::InterpolateClock(*f, clock_before, got.meta.clock()) +
                                         (clock_ - clock_before);
    flow_.Record(r.peer_id, gossip::FetchOutcome::kSuccess, now);
    ++fetches_ok_;
    const uint64_t bytes = got.model.layout.total_bytes();
    bytes_pulled_ += bytes;
    g.fetches_succeeded.Increment();
    g.bytes_pulled.Increment(static_cast<double>(bytes));
    g.interpolation_factor.Observe(*f);
    g.fetch_duration.Observe(absl::ToDoubleSeconds(r.took));
    g.peer_distance.Set(distance);
    return absl::OkStatus();
  }

  const ModeRunnerDeps d_;
  const common::v1::TaskSpec spec_;
  const gossip::GossipConfig config_;
  const uint64_t total_steps_;

  // Worker thread only.
  gossip::FlowControl flow_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::map<std::string, std::string> addresses_;  // candidate id -> address
  uint64_t applied_members_version_ = 0;
  bool started_ = false;
  uint64_t step_ = 0;
  double clock_ = 0;
  double loss_ = 0;  // the last batch's loss (dpwa's state)
  double loss_sum_since_report_ = 0;
  uint32_t losses_since_report_ = 0;
  uint64_t fetches_ok_ = 0;
  uint64_t bytes_pulled_ = 0;
  std::vector<PeerMessage> final_messages_;  // GossipProgress{done} and EvalReport, once done
  std::vector<float> spare_;  // the storage of the last snapshot mixed in, for the next fetch

  absl::Mutex mu_;
  std::vector<coordinator::v1::PeerEndpoint> members_ ABSL_GUARDED_BY(mu_);
  uint64_t members_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

  AsyncFetcher fetcher_;  // last: its thread stops before the rest goes
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModeRunner>> CreateGossipRunner(ModeRunnerDeps deps) {
  SHOAL_RETURN_IF_ERROR(
      CheckRunnerDeps(deps, common::v1::MODE_GOSSIP, {.peers = true, .send = false}));
  if (deps.assigned.spec().round_batches() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", deps.assigned.spec().name(), ": round_batches must be > 0"));
  }
  return std::unique_ptr<ModeRunner>(std::make_unique<GossipRunner>(std::move(deps)));
}

}  // namespace shoal::peer
