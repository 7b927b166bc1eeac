// DecentralizedRunner, the exchange with the other participants: probing them (PeerList),
// fetching and averaging their round updates (StartSharing), and model sync (SyncFrom). The
// round flow is in decentralized_runner.cc.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/retry.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"

namespace shoal::peer {
namespace {

using coordinator::v1::PeerEndpoint;
using coordinator::v1::PeerMessage;

// How a round update is fetched while sharing: retried until it arrives or the round moves on;
// a snapshot that fails the checks (INVALID_ARGUMENT) will not get better.
rpc::RetryOptions FetchRetry(const DecentralizedRunnerOptions& options, size_t bytes) {
  rpc::RetryOptions retry;
  retry.backoff = options.retry_backoff;
  retry.attempt_timeout = FetchAttemptTimeout(options, bytes);
  retry.retryable = [](const absl::Status& s) { return !absl::IsInvalidArgument(s); };
  return retry;
}

// How long a wait for parallel jobs goes without re-checking keep_going by itself (everything
// that changes it, or ends a job, notifies the wakeup; this is only a safety net).
constexpr absl::Duration kRecheck = absl::Seconds(1);

// Runs job(i, stop) for every i in [0, n) on its own thread and waits for all of them, sleeping
// on `wakeup` (each job notifies it when it returns). Once keep_going() turns false it sets
// `stop`, calls `on_stop` (e.g. to cancel calls in flight) and notifies the wakeup (so that jobs
// sleeping between attempts wake up), then still waits for the jobs to return.
void RunParallel(rpc::Wakeup& wakeup, size_t n,
                 const std::function<void(size_t, const std::atomic<bool>&)>& job,
                 const std::function<bool()>& keep_going, const std::function<void()>& on_stop) {
  if (n == 0) return;
  std::atomic<size_t> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      job(i, stop);
      done.fetch_add(1);
      wakeup.Notify();
    });
  }
  while (done.load() < n) {
    if (!stop.load() && !keep_going()) {
      stop.store(true);
      on_stop();
      wakeup.Notify();
      continue;
    }
    wakeup.SleepFor(kRecheck, [&] { return done.load() < n && (stop.load() || keep_going()); });
  }
  for (std::thread& t : threads) t.join();
}

std::string Names(const std::vector<std::string>& ids) {
  return ids.empty() ? "none" : absl::StrJoin(ids, ", ");
}

}  // namespace

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
    if (secure_) {
      ShareMasked(m.round(), m.attempt(), keep_going);
    } else {
      Share(m.round(), m.attempt(), keep_going);
    }
    return;
  }
  if (secure_ && !MaskForPeerList(m)) return;
  // Probe every other participant in parallel.
  std::vector<const PeerEndpoint*> others;
  for (const PeerEndpoint& p : participants_) {
    if (p.peer_id() != deps_.peer_id) others.push_back(&p);
  }
  std::vector<char> reachable(others.size(), 0);
  std::vector<CallCanceller> cancellers(others.size());
  // Every failure counts (a peer that refuses or times out is unreachable), 200 ms apart.
  rpc::RetryOptions retry;
  retry.backoff = BackoffOptions{absl::Milliseconds(200), absl::Milliseconds(200), 1.0, 0};
  retry.attempt_timeout = options_.probe_timeout;
  retry.max_attempts = options_.probe_attempts;
  retry.retryable = [](const absl::Status&) { return true; };
  RunParallel(
      wakeup_, others.size(),
      [&](size_t i, const std::atomic<bool>& stop) {
        peer::v1::ProbeRequest request;
        request.set_task(task_);
        request.set_round(m.round());
        request.set_peer_id(deps_.peer_id);
        absl::Status s =
            rpc::Retry(clock_, retry, absl::InfiniteFuture(),
                       wakeup_.Sleeper([&stop] { return !stop.load(); }), [&](absl::Time deadline) {
                         absl::Status probed =
                             peers_.Probe(others[i]->address(), request, deadline, &cancellers[i]);
                         if (!probed.ok()) {
                           LogInfo("task ", task_, " round ", m.round(), ": probe of ",
                                   others[i]->peer_id(), " failed: ", probed.message());
                         }
                         return probed;
                       });
        reachable[i] = s.ok() ? 1 : 0;
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
  metrics_.decentralized.probes_failed.Increment(static_cast<double>(unreachable.size()));
  LogInfo("task ", task_, " round ", m.round(), " attempt ", m.attempt(), ": reached ",
          others.size() - unreachable.size(), " of ", others.size(),
          " participants (unreachable: ", Names(unreachable), ")");
  PeerMessage out;
  auto* report = out.mutable_connections_report();
  report->set_round(m.round());
  report->set_attempt(m.attempt());
  for (const std::string& id : unreachable) report->add_unreachable(id);
  Send(out);
}

absl::StatusOr<RoundFold> DecentralizedRunner::StartFold(std::vector<std::string> ids) {
  if (spent_fold_ && spent_fold_->layout() == trainer_.layout()) {
    RoundFold fold = *std::move(spent_fold_);
    spent_fold_.reset();
    SHOAL_RETURN_IF_ERROR(fold.Restart(std::move(ids)));
    return fold;
  }
  return RoundFold::Start(strategy_, trainer_.layout(), std::move(ids),
                          deps_.assigned.spec().max_update_norm(),
                          WaitingOptions{options_.hold_bytes, deps_.scratch_dir, model_buffers_});
}

void DecentralizedRunner::SpendFold() {
  if (!round_ || !round_->fold) return;
  round_->fold->DropWaiting();
  spent_fold_ = std::move(round_->fold);
  round_->fold.reset();
}

void DecentralizedRunner::Share(uint64_t round, uint32_t attempt,
                                const std::function<bool()>& keep_going) {
  if (!round_ || round_->round != round || !round_->ready) {
    LogWarning("task ", task_, ": asked to share round ", round,
               " but this peer has no update of it; ignored");
    return;
  }
  const absl::Time start = clock_.Now();
  const tensor::FlatModel& base = RoundBase();
  std::vector<std::string> ids;
  for (const PeerEndpoint& p : participants_) ids.push_back(p.peer_id());
  std::sort(ids.begin(), ids.end());
  if (!round_->fold || round_->fold->participants() != ids) {
    // First share of the round, or the participants changed: a fold cannot take an update out,
    // so it starts again (and fetches every update again).
    if (round_->fold) {
      LogInfo("task ", task_, " round ", round, ": the participants changed to ", Names(ids),
              "; folding their updates again");
    }
    SpendFold();
    absl::StatusOr<RoundFold> fold = StartFold(ids);
    absl::Status s = fold.status();
    if (s.ok()) {
      s = fold->Offer(PeerUpdate{deps_.peer_id, round_->num_samples, round_->update, compressed()},
                      base);
    }
    if (!s.ok()) {
      LogError("task ", task_, " round ", round, ": cannot aggregate: ", s.message());
      SendError(round, s);
      return;
    }
    round_->fold.emplace(*std::move(fold));
  }
  RoundFold& fold = *round_->fold;
  std::vector<const PeerEndpoint*> missing;  // the order they are fetched in
  for (const PeerEndpoint& p : participants_) {
    if (!fold.Has(p.peer_id())) missing.push_back(&p);
  }
  std::sort(missing.begin(), missing.end(), [](const PeerEndpoint* a, const PeerEndpoint* b) {
    return a->peer_id() < b->peer_id();
  });
  // Each update is folded as soon as it arrives and its turn has come (at once where the fold
  // takes any order: exact sums; in ascending id order with the float mean, those that come
  // before their turn waiting: RoundFold). A streaming strategy (mean) fetches at most
  // fetch_window updates at once, so a peer holds a few updates in memory, not every
  // participant's; the others keep every update anyway and fetch them all at once. Rotated,
  // each participant starts with the ids after its own and wraps around, the next fetch
  // starting once any in flight is in: the participants then fetch from different peers at
  // once, and every uplink serves its share of the fetches from the start, where in ascending
  // order all would fetch from the lowest ids first while the highest ids' uplinks idled. With
  // the float mean of a large model that makes updates wait on disk, which pays only over slow
  // links (rotate_below_rate); in ascending order the next fetch starts once the lowest in
  // flight is in, and at most fetch_window − 1 updates wait.
  const tensor::ModelLayout& layout = trainer_.layout();
  // Before its first fetches a participant takes its own measured upload for the links' speed.
  const double link_rate = fetch_rate_ > 0                    ? fetch_rate_
                           : deps_.measured_upload != nullptr ? deps_.measured_upload->load()
                                                              : 0;
  const bool rotated = fold.any_order() ||
                       missing.size() * layout.total_bytes() <= options_.hold_bytes ||
                       std::isinf(options_.rotate_below_rate) ||
                       (link_rate > 0 && link_rate < options_.rotate_below_rate);
  // In ascending order the fetch window bounds what waits: none of it goes to disk.
  fold.set_waiting_memory_bytes(rotated ? options_.hold_bytes : std::numeric_limits<size_t>::max());
  if (rotated) {
    std::rotate(missing.begin(),
                std::find_if(missing.begin(), missing.end(),
                             [&](const PeerEndpoint* p) { return p->peer_id() > deps_.peer_id; }),
                missing.end());
  }
  const size_t window =
      strategy_.streaming() ? std::max<size_t>(1, options_.fetch_window) : missing.size();
  absl::Mutex mu;
  std::vector<bool> finished(missing.size(), false);
  size_t finished_prefix = 0;  // jobs [0, finished_prefix) are done
  size_t finished_count = 0;
  double fetched_bytes = 0;  // of the fetches that succeeded, and their time
  absl::Duration fetch_time;
  std::vector<absl::Status> rejected(missing.size());
  std::vector<CallCanceller> cancellers(missing.size());
  const rpc::RetryOptions retry = FetchRetry(options_, layout.total_bytes());
  RunParallel(
      wakeup_, missing.size(),
      [&](size_t i, const std::atomic<bool>& stop) {
        auto may_start = [&] {
          absl::MutexLock lock(&mu);
          return i < (rotated ? finished_count : finished_prefix) + window;
        };
        while (!stop.load() && !may_start()) {
          wakeup_.SleepFor(kRecheck, [&] { return !stop.load() && !may_start(); });
        }
        const absl::Time fetch_start = clock_.Now();
        peer::v1::GetSnapshotRequest request;
        request.set_task(task_);
        request.set_kind(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
        request.set_round(round);
        request.set_peer_id(deps_.peer_id);
        absl::StatusOr<tensor::ReceivedModel> r =
            stop.load()
                ? absl::CancelledError("stopped")
                : rpc::Retry(clock_, retry, absl::InfiniteFuture(),
                             wakeup_.Sleeper([&stop] { return !stop.load(); }),
                             [&](absl::Time deadline) {
                               absl::StatusOr<tensor::ReceivedModel> fetched =
                                   peers_.Fetch(missing[i]->address(), request, deadline, layout,
                                                &cancellers[i], model_buffers_->Take());
                               if (!fetched.ok() && !absl::IsInvalidArgument(fetched.status())) {
                                 LogWarning("task ", task_, " round ", round,
                                            ": fetching the update of ", missing[i]->peer_id(),
                                            ": ", fetched.status().message(), " (retrying)");
                               }
                               return fetched;
                             });
        const absl::Duration took = clock_.Now() - fetch_start;  // not the wait for mu below
        if (r.ok() && r->meta.delta() != compressed()) {
          r = absl::InvalidArgumentError(
              absl::StrCat("peer ", missing[i]->peer_id(), " served its round update as ",
                           r->meta.delta() ? "a compressed delta" : "a model",
                           "; this task's updates travel as ",
                           compressed() ? "compressed deltas (compression is set)"
                                        : "models (compression: none)"));
        }
        absl::MutexLock lock(&mu);
        // Keep what arrived, even when superseded: a re-share only fetches what is missing.
        if (r.ok()) {
          fetched_bytes += static_cast<double>(layout.total_bytes());
          fetch_time += took;
          rejected[i] =
              fold.Offer(PeerUpdate{missing[i]->peer_id(), r->meta.num_samples(),
                                    model_buffers_->Share(std::move(r->model)), r->meta.delta()},
                         base);
        } else if (absl::IsInvalidArgument(r.status())) {
          rejected[i] = r.status();
        }
        finished[i] = true;
        ++finished_count;
        while (finished_prefix < finished.size() && finished[finished_prefix]) ++finished_prefix;
      },
      keep_going,
      [&] {
        for (CallCanceller& c : cancellers) c.Cancel();
      });
  if (fetch_time > absl::ZeroDuration()) {
    fetch_rate_ = fetched_bytes / absl::ToDoubleSeconds(fetch_time);
  }
  for (const absl::Status& s : rejected) {
    if (!s.ok()) {
      SpendFold();
      LogError("task ", task_, " round ", round, ": ", s.message());
      SendError(round, s);
      return;
    }
  }
  if (!keep_going()) return;
  absl::StatusOr<RoundAggregate> aggregate = fold.Finish(base, model_buffers_->Take());
  if (absl::IsFailedPrecondition(aggregate.status())) {  // an update still missing
    LogWarning("task ", task_, " round ", round, ": ", aggregate.status().message());
    return;
  }
  if (const size_t spilled = fold.spilled(); spilled > 0) {
    metrics_.decentralized.updates_spilled.Increment(static_cast<double>(spilled));
    LogInfo("task ", task_, " round ", round, ": ", spilled,
            " updates waited for their turn on disk (in ",
            deps_.scratch_dir.empty() ? "$TMPDIR or /tmp" : deps_.scratch_dir, ")");
  }
  SpendFold();
  if (!aggregate.ok()) {
    LogError("task ", task_, " round ", round,
             ": cannot aggregate: ", aggregate.status().message());
    SendError(round, aggregate.status());
    return;
  }
  for (const ExcludedUpdate& x : aggregate->excluded) {
    metrics_.decentralized.updates_excluded.Increment();
    LogWarning("task ", task_, " round ", round, ": left the update of ", x.peer_id,
               " out of the aggregate: ", x.reason);
  }
  if (!aggregate->note.empty()) {
    LogWarning("task ", task_, " round ", round, ": ", strategy_.name(), ": ", aggregate->note);
  }
  CompleteSharing(
      round, attempt, std::move(aggregate->model), aggregate->num_samples, start,
      absl::StrFormat("%d updates with %s (%s; left out: %d; fetched %s, %.1f MB/s each)",
                      aggregate->included.size(), strategy_.name(), Names(aggregate->included),
                      aggregate->excluded.size(),
                      rotated ? "from the ids after its own first" : "in id order",
                      fetch_rate_ / 1e6));
}

void DecentralizedRunner::ShareMasked(uint64_t round, uint32_t attempt,
                                      const std::function<bool()>& keep_going) {
  if (!round_ || round_->round != round || !round_->secure ||
      round_->secure->masked_with().empty()) {
    LogWarning("task ", task_, ": asked to share round ", round,
               " but this peer has no masked update of it; ignored");
    return;
  }
  SecureRound& secure = *round_->secure;
  std::vector<const PeerEndpoint*> missing;
  for (const PeerEndpoint& p : participants_) {
    if (p.peer_id() != deps_.peer_id && !secure.Holds(p.peer_id())) missing.push_back(&p);
  }
  // Every masked update is kept until the survivors are known (a dropped participant's is left
  // out then), so all are fetched at once.
  const tensor::ModelLayout layout = SecureRound::MaskedLayout(trainer_.layout().total_elements());
  absl::Mutex mu;
  std::vector<absl::Status> rejected(missing.size());
  std::vector<CallCanceller> cancellers(missing.size());
  const rpc::RetryOptions retry = FetchRetry(options_, layout.total_bytes());
  RunParallel(
      wakeup_, missing.size(),
      [&](size_t i, const std::atomic<bool>& stop) {
        peer::v1::GetSnapshotRequest request;
        request.set_task(task_);
        request.set_kind(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
        request.set_round(round);
        request.set_peer_id(deps_.peer_id);
        absl::StatusOr<tensor::ReceivedModel> r = rpc::Retry(
            clock_, retry, absl::InfiniteFuture(),
            wakeup_.Sleeper([&stop] { return !stop.load(); }), [&](absl::Time deadline) {
              absl::StatusOr<tensor::ReceivedModel> fetched =
                  peers_.Fetch(missing[i]->address(), request, deadline, layout, &cancellers[i]);
              if (!fetched.ok() && !absl::IsInvalidArgument(fetched.status())) {
                LogWarning("task ", task_, " round ", round, ": fetching the masked update of ",
                           missing[i]->peer_id(), ": ", fetched.status().message(), " (retrying)");
              }
              return fetched;
            });
        absl::MutexLock lock(&mu);
        if (r.ok()) {
          rejected[i] = secure.Hold(missing[i]->peer_id(), r->model, r->meta.num_samples());
        } else if (absl::IsInvalidArgument(r.status())) {
          rejected[i] = r.status();
        }
      },
      keep_going,
      [&] {
        for (CallCanceller& c : cancellers) c.Cancel();
      });
  for (const absl::Status& s : rejected) {
    if (!s.ok()) {
      LogError("task ", task_, " round ", round, ": ", s.message());
      SendError(round, s);
      return;
    }
  }
  if (!keep_going()) return;
  for (const PeerEndpoint* p : missing) {
    if (!secure.Holds(p->peer_id())) return;  // stopped
  }
  deps_.update_hooks.BeforeMaskedUpdatesHeld(round, keep_going);
  if (!keep_going()) return;
  LogInfo("task ", task_, " round ", round, " attempt ", attempt,
          ": holding the masked updates of all ", participants_.size(), " participants");
  PeerMessage out;
  out.mutable_masked_updates_held()->set_round(round);
  out.mutable_masked_updates_held()->set_attempt(attempt);
  Send(out);
}

const tensor::FlatModel& DecentralizedRunner::RoundBase() const {
  // Already moved to round_->base when this is a re-share after a participant left.
  if (round_ && model_round_ >= round_->round) {
    static const tensor::FlatModel* const kNone = new tensor::FlatModel();
    return round_->base != nullptr ? *round_->base : *kNone;
  }
  return *held_;
}

void DecentralizedRunner::CompleteSharing(uint64_t round, uint32_t attempt, tensor::FlatModel model,
                                          uint64_t num_samples, absl::Time start,
                                          const std::string& what) {
  if (absl::Status s = trainer_.SetParameters(model); !s.ok()) {
    LogError("task ", task_, " round ", round, ": cannot aggregate: ", s.message());
    SendError(round, s);
    return;
  }
  if (model_round_ < round) {
    round_->base = std::move(held_);  // restored if this peer is removed from the round later
  }
  held_ = model_buffers_->Share(std::move(model));
  model_round_ = round;
  params_are_held_ = true;
  round_->shared_attempt = attempt;
  const uint64_t digest = held_->Digest();
  PublishHeld(num_samples, round_->train_loss);
  const double seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  metrics_.decentralized.sharing_duration.Observe(seconds);
  metrics_.rounds_completed.Increment();
  LogInfo(
      absl::StrFormat("task %s round %d attempt %d: aggregated %s, %d samples, in %.3f s, "
                      "digest %016x",
                      task_, round, attempt, what, num_samples, seconds, digest));
  PeerMessage out;
  auto* done = out.mutable_sharing_done();
  done->set_round(round);
  done->set_attempt(attempt);
  done->set_digest_xxh3(digest);
  done->set_num_samples(num_samples);
  // On disk before SharingDone: once every participant reported it, the coordinator counts the
  // round complete, and a peer killed from then on must hold this model when started again.
  KeepHeld();
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
  // A provider without that round (NOT_FOUND, FAILED_PRECONDITION) or a bad snapshot will not
  // get better by retrying: report it so the coordinator picks another provider.
  rpc::RetryOptions retry;
  retry.backoff = options_.retry_backoff;
  retry.attempt_timeout = FetchAttemptTimeout(options_, trainer_.layout().total_bytes());
  retry.retryable = [](const absl::Status& s) {
    return !absl::IsInvalidArgument(s) && !absl::IsNotFound(s) && !absl::IsFailedPrecondition(s);
  };
  absl::StatusOr<tensor::ReceivedModel> received = rpc::Retry(
      clock_, retry, deadline, wakeup_.Sleeper(keep_going), [&](absl::Time attempt_deadline) {
        // The deadline bounds the call; keep_going is checked between attempts.
        return peers_.Fetch(address, request, attempt_deadline, trainer_.layout());
      });
  if (!received.ok() && retry.retryable(received.status()) && !keep_going()) {
    return;  // superseded (e.g. another SyncFrom)
  }
  PeerMessage out;
  auto* done = out.mutable_sync_done();
  done->set_round(m.round());
  done->set_provider(m.provider().peer_id());
  absl::Status s = received.status();
  if (s.ok()) s = trainer_.SetParameters(received->model);
  if (!s.ok()) {
    metrics_.decentralized.sync_failures.Increment();
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
  // Top-k's residual belongs to the trajectory this peer leaves.
  compressor_ = tensor::Compressor(compressor_.settings());
  round_.reset();
  held_ = std::make_shared<const tensor::FlatModel>(std::move(received->model));
  model_round_ = m.round();
  params_are_held_ = true;
  const uint64_t digest = held_->Digest();
  const uint64_t bytes = held_->layout.total_bytes();
  PublishHeld(received->meta.num_samples(), 0);
  snapshots_.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  metrics_.decentralized.sync_transfers.Increment();
  const int64_t ms = absl::ToInt64Milliseconds(clock_.Now() - start);
  LogInfo(
      absl::StrFormat("task %s: synced the model of round %d from %s (%d bytes, %d ms, digest "
                      "%016x)",
                      task_, m.round(), m.provider().peer_id(), bytes, ms, digest));
  done->set_ok(true);
  done->set_digest_xxh3(digest);
  done->set_duration_ms(ms);
  done->set_bytes(bytes);
  KeepHeld();  // on disk before the coordinator counts this peer as a holder of the round
  Send(out);
  SendModelHeld();
}

}  // namespace shoal::peer
