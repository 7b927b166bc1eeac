#include "services/peer_agent/decentralized_runner.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"

namespace shoal::peer {
namespace {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerEndpoint;
using coordinator::v1::PeerMessage;

constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

// Runs job(i, stop) for every i in [0, n) on its own thread and waits for all of them. While
// waiting it polls `keep_going`; once that turns false it sets `stop` and calls `on_stop` (e.g.
// to cancel calls in flight), then still waits for the jobs to return.
void RunParallel(size_t n, const std::function<void(size_t, const std::atomic<bool>&)>& job,
                 const std::function<bool()>& keep_going, const std::function<void()>& on_stop) {
  if (n == 0) return;
  absl::Mutex mu;
  size_t done = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      job(i, stop);
      absl::MutexLock lock(&mu);
      ++done;
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == n; };
    while (!mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Milliseconds(50))) {
      if (!stop.load() && !keep_going()) {
        stop.store(true);
        mu.Unlock();
        on_stop();
        mu.Lock();
      }
    }
  }
  for (std::thread& t : threads) t.join();
}

// Sleeps `delay` in small steps; false as soon as `stop` is set.
bool SleepUnlessStopped(absl::Duration delay, const std::atomic<bool>& stop) {
  const absl::Time until = absl::Now() + delay;
  while (absl::Now() < until) {
    if (stop.load()) return false;
    absl::SleepFor(std::min(kPollInterval, until - absl::Now()));
  }
  return !stop.load();
}

std::string Names(const std::vector<std::string>& ids) {
  return ids.empty() ? "none" : absl::StrJoin(ids, ", ");
}

}  // namespace

absl::StatusOr<tensor::FlatModel> AverageUpdates(std::vector<PeerUpdate> updates) {
  if (updates.empty()) return absl::InvalidArgumentError("no updates to average");
  std::sort(updates.begin(), updates.end(),
            [](const PeerUpdate& a, const PeerUpdate& b) { return a.peer_id < b.peer_id; });
  double total = 0;
  for (size_t j = 0; j < updates.size(); ++j) {
    const PeerUpdate& u = updates[j];
    if (j > 0 && u.peer_id == updates[j - 1].peer_id) {
      return absl::InvalidArgumentError(absl::StrCat("two updates from peer ", u.peer_id));
    }
    if (u.model == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, " has no model"));
    }
    if (!(u.model->layout == updates[0].model->layout) ||
        u.model->values.size() != updates[0].model->layout.total_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update of peer ", u.peer_id, " has layout ",
                       u.model->layout.DebugString(), ", the update of peer ", updates[0].peer_id,
                       " has ", updates[0].model->layout.DebugString()));
    }
    total += static_cast<double>(u.num_samples);
  }
  if (total <= 0) return absl::InvalidArgumentError("the updates were trained on 0 samples");
  const size_t n = updates[0].model->values.size();
  std::vector<double> sum(n, 0.0);
  for (const PeerUpdate& u : updates) {  // ascending peer id: the same order everywhere
    const double w = static_cast<double>(u.num_samples);
    const std::vector<float>& x = u.model->values;
    for (size_t i = 0; i < n; ++i) sum[i] += w * static_cast<double>(x[i]);
  }
  tensor::FlatModel out;
  out.layout = updates[0].model->layout;
  out.values.resize(n);
  for (size_t i = 0; i < n; ++i) out.values[i] = static_cast<float>(sum[i] / total);
  return out;
}

absl::StatusOr<std::unique_ptr<DecentralizedRunner>> DecentralizedRunner::Create(
    ModeRunnerDeps deps, DecentralizedRunnerOptions options) {
  if (deps.trainer == nullptr || deps.snapshots == nullptr || deps.peers == nullptr ||
      deps.metrics == nullptr || deps.clock == nullptr || !deps.send) {
    return absl::InvalidArgumentError("the decentralized runner is missing a dependency");
  }
  if (deps.assigned.spec().mode() != common::v1::MODE_DECENTRALIZED) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", deps.assigned.spec().name(), " is not in mode decentralized"));
  }
  if (deps.peer_id.empty()) {
    return absl::InvalidArgumentError("the decentralized runner needs this peer's id");
  }
  if (options.probe_attempts < 1 || options.probe_timeout <= absl::ZeroDuration() ||
      options.fetch_timeout <= absl::ZeroDuration() ||
      options.sync_budget <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("decentralized runner options: bad timeouts or attempts");
  }
  if (deps.assigned.spec().round_deadline_seconds() > 0) {
    options.sync_budget = absl::Seconds(deps.assigned.spec().round_deadline_seconds());
  }
  return std::unique_ptr<DecentralizedRunner>(new DecentralizedRunner(std::move(deps), options));
}

DecentralizedRunner::DecentralizedRunner(ModeRunnerDeps deps, DecentralizedRunnerOptions options)
    : deps_(std::move(deps)),
      options_(options),
      task_(deps_.assigned.spec().name()),
      trainer_(*deps_.trainer),
      snapshots_(*deps_.snapshots),
      peers_(*deps_.peers),
      metrics_(*deps_.metrics),
      clock_(*deps_.clock) {}

void DecentralizedRunner::Send(const PeerMessage& message) { deps_.send(message); }

void DecentralizedRunner::SendError(uint64_t round, const absl::Status& status) {
  PeerMessage m;
  m.set_task(task_);
  m.mutable_error()->set_round(round);
  m.mutable_error()->set_message(std::string(status.message()));
  Send(m);
}

void DecentralizedRunner::SendModelHeld() {
  PeerMessage m;
  m.set_task(task_);
  m.mutable_model_held()->set_round(model_round_);
  m.mutable_model_held()->set_digest_xxh3(held_.Digest());
  Send(m);
}

absl::Status DecentralizedRunner::RestoreHeld() {
  if (params_are_held_) return absl::OkStatus();
  SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(held_));
  params_are_held_ = true;
  return absl::OkStatus();
}

bool DecentralizedRunner::SleepWhile(absl::Duration delay,
                                     const std::function<bool()>& keep_going) const {
  const absl::Time until = clock_.Now() + delay;
  while (clock_.Now() < until) {
    if (!keep_going()) return false;
    absl::SleepFor(std::min(kPollInterval, until - clock_.Now()));
  }
  return keep_going();
}

void DecentralizedRunner::Start() {
  if (held_.values.empty()) {
    absl::StatusOr<tensor::FlatModel> init = trainer_.InitialParameters();
    absl::Status s = init.status();
    if (s.ok()) s = trainer_.SetParameters(*init);
    if (!s.ok()) {
      LogError("task ", task_, ": cannot build the initial model: ", s.message());
      SendError(0, s);
      return;
    }
    held_ = *std::move(init);
    model_round_ = 0;
    params_are_held_ = true;
  }
  LogInfo(absl::StrFormat("task %s: decentralized, holding the model of round %d (digest %016x)",
                          task_, model_round_, held_.Digest()));
  SendModelHeld();
}

bool DecentralizedRunner::Supersedes(const CoordinatorEvent& e) const {
  return e.has_round_open() || e.has_join_refused() || e.has_peer_list() || e.has_start_sharing() ||
         e.has_connection_failed() || e.has_sync_from() || e.has_task_assigned() ||
         e.has_task_finished();
}

void DecentralizedRunner::Handle(const CoordinatorEvent& e,
                                 const std::function<bool()>& keep_going) {
  switch (e.kind_case()) {
    case CoordinatorEvent::kTaskAssigned:
      // Re-assigned after a reconnect: whatever round was running is gone for the coordinator.
      if (round_ && model_round_ < round_->round) AbandonRound("re-assigned");
      round_.reset();
      SendModelHeld();
      break;
    case CoordinatorEvent::kRoundOpen:
      HandleRoundOpen(e.round_open(), keep_going);
      break;
    case CoordinatorEvent::kJoinRefused:
      metrics_.rounds_refused.Increment();
      DropCompletedRoundBefore(e.join_refused().round());
      if (round_ && round_->round <= e.join_refused().round()) {
        AbandonRound(absl::StrCat("join refused: ", e.join_refused().reason()));
      }
      break;
    case CoordinatorEvent::kConnectionFailed:
      metrics_.rounds_refused.Increment();
      DropCompletedRoundBefore(e.connection_failed().round());
      if (round_ && round_->round <= e.connection_failed().round()) {
        AbandonRound(
            absl::StrCat("removed after failing to connect: ", e.connection_failed().reason()));
      }
      for (const PeerEndpoint& p : participants_) peers_.Forget(p.address());
      participants_.clear();
      break;
    case CoordinatorEvent::kPeerList:
      HandlePeerList(e.peer_list(), keep_going);
      break;
    case CoordinatorEvent::kStartSharing:
      if (!round_ || round_->round != e.start_sharing().round()) {
        LogWarning("task ", task_, ": StartSharing for round ", e.start_sharing().round(),
                   " which this peer is not in; ignored");
        break;
      }
      Share(e.start_sharing().round(), e.start_sharing().attempt(), keep_going);
      break;
    case CoordinatorEvent::kModelPublished:
      HandleModelPublished(e.model_published(), keep_going);
      break;
    case CoordinatorEvent::kSyncFrom:
      HandleSyncFrom(e.sync_from(), keep_going);
      break;
    case CoordinatorEvent::kSyncServe:
      LogInfo("task ", task_, ": serving the model of round ", e.sync_serve().round(), " to ",
              e.sync_serve().peer_id(), " (holding round ", model_round_, ")");
      break;
    case CoordinatorEvent::kWaiting:
      LogInfo("task ", task_, ": waiting for peers (", e.waiting().have(), " of ",
              e.waiting().need(), ")");
      break;
    default:
      LogWarning("task ", task_, ": ignoring coordinator event (field ",
                 static_cast<int>(e.kind_case()), ") in decentralized mode");
  }
}

void DecentralizedRunner::DropCompletedRoundBefore(uint64_t round) {
  if (round_ && round_->round < round && model_round_ >= round_->round) round_.reset();
}

void DecentralizedRunner::AbandonRound(const std::string& why) {
  if (round_) {
    LogInfo("task ", task_, " round ", round_->round, ": leaving the round (", why, ")");
    if (model_round_ >= round_->round && !round_->base.values.empty()) {
      // Already averaged: go back to the model held before the round.
      held_ = std::move(round_->base);
      model_round_ = round_->round - 1;
      params_are_held_ = false;
      snapshots_.Clear(peer::v1::SNAPSHOT_KIND_GLOBAL);
    }
  }
  round_.reset();
  snapshots_.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    LogError("task ", task_, ": cannot restore the model of round ", model_round_, ": ",
             s.message());
  }
}

void DecentralizedRunner::HandleRoundOpen(const coordinator::v1::RoundOpen& m,
                                          const std::function<bool()>& keep_going) {
  const uint64_t r = m.round();
  if (round_ && round_->round == r && round_->ready) {
    // A repeated RoundOpen (e.g. after a reconnect): answer again without training again.
    PeerMessage join;
    join.set_task(task_);
    join.mutable_join_round()->set_round(r);
    Send(join);
    PeerMessage ready;
    auto* rr = ready.mutable_round_ready();
    ready.set_task(task_);
    rr->set_round(r);
    rr->set_num_samples(round_->num_samples);
    rr->set_train_loss(round_->train_loss);
    rr->set_train_ms(round_->train_ms);
    Send(ready);
    return;
  }
  if (r != model_round_ + 1) {
    LogWarning("task ", task_, ": RoundOpen for round ", r,
               " but this peer holds the model of round ", model_round_,
               "; telling the coordinator");
    SendModelHeld();
    return;
  }
  if (round_ && model_round_ >= round_->round) {
    round_.reset();  // the previous round completed here (its ModelPublished went missing)
  } else if (round_) {
    AbandonRound("a new round opened");
  }
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    SendError(r, s);
    return;
  }
  round_.emplace();
  round_->round = r;
  PeerMessage join;
  join.set_task(task_);
  join.mutable_join_round()->set_round(r);
  Send(join);
  metrics_.rounds_joined.Increment();
  // The previous round's evaluation, deferred so that JoinRound went out first.
  RunPendingEval();

  const absl::Time start = clock_.Now();
  const std::optional<absl::Time> ready_deadline =
      m.ready_deadline_unix_ms() > 0
          ? std::optional(absl::FromUnixMillis(m.ready_deadline_unix_ms()))
          : std::nullopt;
  auto train_going = [&] {
    return keep_going() && (!ready_deadline || clock_.Now() < *ready_deadline);
  };
  params_are_held_ = false;
  absl::StatusOr<training::TrainStats> stats =
      trainer_.TrainBatches(m.round_batches(), train_going);
  if (!stats.ok()) {
    if (absl::IsCancelled(stats.status())) {
      metrics_.rounds_abandoned.Increment();
      AbandonRound(keep_going() ? "missed the ready deadline" : "superseded");
      return;
    }
    LogError("task ", task_, " round ", r, ": ", stats.status().message());
    SendError(r, stats.status());
    AbandonRound("training failed");
    return;
  }
  absl::StatusOr<tensor::FlatModel> params = trainer_.GetParameters();
  if (!params.ok()) {
    SendError(r, params.status());
    AbandonRound("cannot read the parameters");
    return;
  }
  const int64_t train_ms = absl::ToInt64Milliseconds(clock_.Now() - start);
  metrics_.samples_trained.Increment(static_cast<double>(stats->samples));
  metrics_.train_loss.Set(stats->mean_loss);
  metrics_.round_duration.Observe(static_cast<double>(train_ms) / 1000.0);
  round_->update = std::make_shared<const tensor::FlatModel>(*std::move(params));
  round_->num_samples = stats->samples;
  round_->train_loss = stats->mean_loss;
  round_->train_ms = train_ms;
  round_->ready = true;
  Snapshot update;
  update.task = task_;
  update.version = r;
  update.model = round_->update;
  update.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
  update.round = r;
  update.num_samples = stats->samples;
  update.loss = stats->mean_loss;
  snapshots_.Publish(std::move(update));
  LogInfo(absl::StrFormat("task %s round %d: trained %d batches, loss %.4f, %d samples, %.2f s",
                          task_, r, stats->batches, stats->mean_loss, stats->samples,
                          static_cast<double>(train_ms) / 1000.0));
  PeerMessage ready;
  auto* rr = ready.mutable_round_ready();
  ready.set_task(task_);
  rr->set_round(r);
  rr->set_num_samples(stats->samples);
  rr->set_train_loss(stats->mean_loss);
  rr->set_train_ms(train_ms);
  Send(ready);
}

void DecentralizedRunner::HandlePeerList(const coordinator::v1::PeerList& m,
                                         const std::function<bool()>& keep_going) {
  if (!round_ || round_->round != m.round() || !round_->ready) {
    LogWarning("task ", task_, ": PeerList for round ", m.round(),
               " but this peer has no update of that round; ignored");
    return;
  }
  participants_.assign(m.participants().begin(), m.participants().end());
  bool self_listed = false;
  for (const PeerEndpoint& p : participants_) self_listed |= p.peer_id() == deps_.peer_id;
  if (!self_listed) {
    LogWarning("task ", task_, ": PeerList for round ", m.round(), " attempt ", m.attempt(),
               " does not list this peer; ignored");
    return;
  }
  if (m.sharing()) {
    Share(m.round(), m.attempt(), keep_going);
    return;
  }
  // Probe every other participant in parallel.
  std::vector<const PeerEndpoint*> others;
  for (const PeerEndpoint& p : participants_) {
    if (p.peer_id() != deps_.peer_id) others.push_back(&p);
  }
  std::vector<char> reachable(others.size(), 0);
  std::vector<CallCanceller> cancellers(others.size());
  const DecentralizedRunnerOptions& o = options_;
  RunParallel(
      others.size(),
      [&](size_t i, const std::atomic<bool>& stop) {
        peer::v1::ProbeRequest request;
        request.set_task(task_);
        request.set_round(m.round());
        request.set_peer_id(deps_.peer_id);
        for (int attempt = 0; attempt < o.probe_attempts && !stop.load(); ++attempt) {
          absl::Status s = peers_.Probe(others[i]->address(), request,
                                        absl::Now() + o.probe_timeout, &cancellers[i]);
          if (s.ok()) {
            reachable[i] = 1;
            return;
          }
          LogInfo("task ", task_, " round ", m.round(), ": probe of ", others[i]->peer_id(),
                  " failed: ", s.message());
          if (!SleepUnlessStopped(absl::Milliseconds(200), stop)) return;
        }
      },
      keep_going,
      [&] {
        for (CallCanceller& c : cancellers) c.Cancel();
      });
  if (!keep_going()) return;  // a newer PeerList, a removal, ...
  std::vector<std::string> unreachable;
  for (size_t i = 0; i < others.size(); ++i) {
    if (!reachable[i]) unreachable.push_back(others[i]->peer_id());
  }
  std::sort(unreachable.begin(), unreachable.end());
  metrics_.probes_failed.Increment(static_cast<double>(unreachable.size()));
  LogInfo("task ", task_, " round ", m.round(), " attempt ", m.attempt(), ": reached ",
          others.size() - unreachable.size(), " of ", others.size(),
          " participants (unreachable: ", Names(unreachable), ")");
  PeerMessage out;
  auto* report = out.mutable_connections_report();
  out.set_task(task_);
  report->set_round(m.round());
  report->set_attempt(m.attempt());
  for (const std::string& id : unreachable) report->add_unreachable(id);
  Send(out);
}

void DecentralizedRunner::Share(uint64_t round, uint32_t attempt,
                                const std::function<bool()>& keep_going) {
  if (!round_ || round_->round != round || !round_->ready) {
    LogWarning("task ", task_, ": asked to share round ", round,
               " but this peer has no update of it; ignored");
    return;
  }
  const absl::Time start = clock_.Now();
  std::vector<const PeerEndpoint*> missing;
  for (const PeerEndpoint& p : participants_) {
    if (p.peer_id() != deps_.peer_id && !round_->fetched.contains(p.peer_id())) {
      missing.push_back(&p);
    }
  }
  std::vector<std::optional<PeerUpdate>> got(missing.size());
  std::vector<absl::Status> rejected(missing.size());
  std::vector<CallCanceller> cancellers(missing.size());
  const DecentralizedRunnerOptions& o = options_;
  const tensor::ModelLayout& layout = trainer_.layout();
  RunParallel(
      missing.size(),
      [&](size_t i, const std::atomic<bool>& stop) {
        peer::v1::GetSnapshotRequest request;
        request.set_task(task_);
        request.set_kind(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
        request.set_round(round);
        request.set_peer_id(deps_.peer_id);
        Backoff backoff(o.retry_backoff);
        while (!stop.load()) {
          absl::StatusOr<rpc::ReceivedModel> r =
              peers_.Fetch(missing[i]->address(), request, absl::Now() + o.fetch_timeout, layout,
                           &cancellers[i]);
          if (r.ok()) {
            got[i] = PeerUpdate{missing[i]->peer_id(), r->meta.num_samples(),
                                std::make_shared<const tensor::FlatModel>(std::move(r->model))};
            return;
          }
          if (absl::IsInvalidArgument(r.status())) {
            rejected[i] = r.status();
            return;
          }
          LogWarning("task ", task_, " round ", round, ": fetching the update of ",
                     missing[i]->peer_id(), ": ", r.status().message(), " (retrying)");
          if (!SleepUnlessStopped(backoff.Next(), stop)) return;
        }
      },
      keep_going,
      [&] {
        for (CallCanceller& c : cancellers) c.Cancel();
      });
  // Keep what arrived, even when superseded: a re-share only fetches what is still missing.
  for (std::optional<PeerUpdate>& u : got) {
    if (u) {
      std::string id = u->peer_id;
      round_->fetched[id] = *std::move(u);
    }
  }
  for (const absl::Status& s : rejected) {
    if (!s.ok()) {
      LogError("task ", task_, " round ", round, ": ", s.message());
      SendError(round, s);
      return;
    }
  }
  if (!keep_going()) return;

  std::vector<PeerUpdate> updates;
  std::vector<std::string> ids;
  for (const PeerEndpoint& p : participants_) {
    ids.push_back(p.peer_id());
    if (p.peer_id() == deps_.peer_id) {
      updates.push_back(PeerUpdate{deps_.peer_id, round_->num_samples, round_->update});
      continue;
    }
    auto it = round_->fetched.find(p.peer_id());
    if (it == round_->fetched.end()) {
      LogWarning("task ", task_, " round ", round, ": the update of ", p.peer_id(),
                 " is still missing");
      return;
    }
    updates.push_back(it->second);
  }
  uint64_t total_samples = 0;
  for (const PeerUpdate& u : updates) total_samples += u.num_samples;
  absl::StatusOr<tensor::FlatModel> average = AverageUpdates(std::move(updates));
  absl::Status s = average.status();
  if (s.ok()) s = trainer_.SetParameters(*average);
  if (!s.ok()) {
    LogError("task ", task_, " round ", round, ": cannot average: ", s.message());
    SendError(round, s);
    return;
  }
  if (model_round_ < round) {
    round_->base = std::move(held_);  // restored if this peer is removed from the round later
  }
  held_ = *std::move(average);
  model_round_ = round;
  params_are_held_ = true;
  round_->shared_attempt = attempt;
  const uint64_t digest = held_.Digest();
  Snapshot global;
  global.task = task_;
  global.version = round;
  global.model = std::make_shared<const tensor::FlatModel>(held_);
  global.kind = peer::v1::SNAPSHOT_KIND_GLOBAL;
  global.round = round;
  global.num_samples = total_samples;
  global.loss = round_->train_loss;
  snapshots_.Publish(std::move(global));
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  metrics_.sharing_duration.Observe(seconds);
  metrics_.rounds_completed.Increment();
  std::sort(ids.begin(), ids.end());
  LogInfo(absl::StrFormat(
      "task %s round %d attempt %d: averaged %d updates (%s; %d samples) in %.3f s, digest %016x",
      task_, round, attempt, ids.size(), Names(ids), total_samples, seconds, digest));
  PeerMessage out;
  auto* done = out.mutable_sharing_done();
  out.set_task(task_);
  done->set_round(round);
  done->set_attempt(attempt);
  done->set_digest_xxh3(digest);
  done->set_num_samples(total_samples);
  Send(out);
}

void DecentralizedRunner::HandleModelPublished(const coordinator::v1::ModelPublished& m,
                                               const std::function<bool()>& keep_going) {
  if (model_round_ != m.version()) {
    LogWarning("task ", task_, ": ModelPublished version ", m.version(),
               " but this peer holds the model of round ", model_round_, "; not evaluated");
    return;
  }
  if (round_ && round_->round <= m.round()) round_.reset();  // the round is complete
  if (absl::Status s = RestoreHeld(); !s.ok()) {
    SendError(m.round(), s);
    return;
  }
  // The coordinator sends the next RoundOpen right behind ModelPublished: give it a moment to
  // arrive, so that every peer makes the same choice (an evaluation before training would make
  // this peer the round's straggler).
  if (m.round() < deps_.assigned.spec().rounds()) {
    SleepWhile(options_.next_round_grace, keep_going);
  }
  if (!keep_going()) {
    // The next round is already open: answer it with JoinRound first (a JoinRound after the
    // first RoundReady would be refused), then evaluate this model, then train.
    pending_eval_ = PendingEval{m.round(), m.version(), held_};
    LogInfo("task ", task_, " round ", m.round(),
            ": the next round is open; evaluating this model after joining it");
    return;
  }
  pending_eval_.reset();
  EvaluateAndReport(m.round(), m.version());
}

void DecentralizedRunner::RunPendingEval() {
  if (!pending_eval_) return;
  PendingEval pending = *std::move(pending_eval_);
  pending_eval_.reset();
  absl::StatusOr<tensor::FlatModel> current = trainer_.GetParameters();
  absl::Status s = current.status();
  if (s.ok()) s = trainer_.SetParameters(pending.model);
  if (!s.ok()) {
    LogWarning("task ", task_, ": cannot evaluate round ", pending.round, ": ", s.message());
    return;
  }
  EvaluateAndReport(pending.round, pending.version);
  if (absl::Status r = trainer_.SetParameters(*current); !r.ok()) {
    LogError("task ", task_, ": cannot restore the parameters after evaluating: ", r.message());
  }
}

void DecentralizedRunner::EvaluateAndReport(uint64_t round, uint64_t version) {
  absl::StatusOr<training::EvalStats> eval = trainer_.Evaluate();
  if (!eval.ok()) {
    LogError("task ", task_, ": evaluating round ", round, ": ", eval.status().message());
    SendError(round, eval.status());
    return;
  }
  metrics_.test_accuracy.Set(eval->accuracy());
  LogInfo(absl::StrFormat("task %s round %d: model test accuracy %.4f (%d/%d)", task_, round,
                          eval->accuracy(), eval->correct, eval->total));
  PeerMessage out;
  auto* r = out.mutable_eval_report();
  out.set_task(task_);
  r->set_version(version);
  r->set_correct(eval->correct);
  r->set_total(eval->total);
  r->set_loss_sum(eval->loss_sum);
  Send(out);
}

void DecentralizedRunner::HandleSyncFrom(const coordinator::v1::SyncFrom& m,
                                         const std::function<bool()>& keep_going) {
  const absl::Time start = clock_.Now();
  const absl::Time deadline = start + options_.sync_budget;
  const std::string& address = m.provider().address();
  LogInfo("task ", task_, ": syncing the model of round ", m.round(), " from ",
          m.provider().peer_id(), " at ", address);
  peer::v1::GetSnapshotRequest request;
  request.set_task(task_);
  request.set_kind(peer::v1::SNAPSHOT_KIND_GLOBAL);
  request.set_round(m.round());
  request.set_peer_id(deps_.peer_id);
  Backoff backoff(options_.retry_backoff);
  absl::StatusOr<rpc::ReceivedModel> received = absl::UnavailableError("not fetched");
  while (true) {
    CallCanceller canceller;  // the deadline bounds the call; keep_going is checked between
    received =
        peers_.Fetch(address, request, std::min(deadline, clock_.Now() + options_.fetch_timeout),
                     trainer_.layout(), &canceller);
    // A provider without that round (NOT_FOUND, FAILED_PRECONDITION) or a bad snapshot will not
    // get better by retrying: report it so the coordinator picks another provider.
    if (received.ok() || absl::IsInvalidArgument(received.status()) ||
        absl::IsNotFound(received.status()) || absl::IsFailedPrecondition(received.status())) {
      break;
    }
    const absl::Duration delay = backoff.Next();
    if (clock_.Now() + delay >= deadline) break;
    if (!SleepWhile(delay, keep_going)) return;  // superseded (e.g. another SyncFrom)
  }
  PeerMessage out;
  auto* done = out.mutable_sync_done();
  out.set_task(task_);
  done->set_round(m.round());
  done->set_provider(m.provider().peer_id());
  absl::Status s = received.status();
  if (s.ok()) s = trainer_.SetParameters(received->model);
  if (!s.ok()) {
    metrics_.sync_failures.Increment();
    LogWarning("task ", task_, ": model sync from ", m.provider().peer_id(),
               " failed: ", s.message());
    done->set_ok(false);
    done->set_message(std::string(s.message()));
    done->set_duration_ms(absl::ToInt64Milliseconds(clock_.Now() - start));
    Send(out);
    params_are_held_ = false;
    (void)RestoreHeld();
    return;
  }
  if (absl::Status r = trainer_.ResetOptimizer(); !r.ok()) {
    LogWarning("task ", task_, ": cannot reset the optimizer: ", r.message());
  }
  round_.reset();
  held_ = std::move(received->model);
  model_round_ = m.round();
  params_are_held_ = true;
  const uint64_t digest = held_.Digest();
  const uint64_t bytes = held_.layout.total_bytes();
  Snapshot global;
  global.task = task_;
  global.version = m.round();
  global.model = std::make_shared<const tensor::FlatModel>(held_);
  global.kind = peer::v1::SNAPSHOT_KIND_GLOBAL;
  global.round = m.round();
  global.num_samples = received->meta.num_samples();
  snapshots_.Publish(std::move(global));
  snapshots_.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  metrics_.sync_transfers.Increment();
  const int64_t ms = absl::ToInt64Milliseconds(clock_.Now() - start);
  LogInfo(
      absl::StrFormat("task %s: synced the model of round %d from %s (%d bytes, %d ms, digest "
                      "%016x)",
                      task_, m.round(), m.provider().peer_id(), bytes, ms, digest));
  done->set_ok(true);
  done->set_digest_xxh3(digest);
  done->set_duration_ms(ms);
  done->set_bytes(bytes);
  Send(out);
  SendModelHeld();
}

}  // namespace shoal::peer
