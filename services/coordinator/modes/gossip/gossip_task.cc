#include "services/coordinator/modes/gossip/gossip_task.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "services/coordinator/modes/gossip/gossip_privacy.h"
#include "services/coordinator/round_lists.h"

namespace shoal::coordinator {
namespace {

// After every member is done, how long to wait for the EvalReports still missing.
constexpr absl::Duration kFinalEvalTimeout = absl::Seconds(60);

class GossipTask final : public ModeTask {
 public:
  GossipTask(const v1::TaskStatus& status, CoordinatorMetrics& metrics)
      : task_(status.spec().name()),
        spec_(status.spec()),
        metrics_(metrics),
        privacy_(spec_, metrics),
        total_steps_(static_cast<uint64_t>(spec_.rounds()) * spec_.round_batches()),
        completed_(std::min<uint64_t>(CompletedRounds(status), spec_.rounds())) {}

  ~GossipTask() override {
    metrics_.gossip.members.Decrement(static_cast<double>(members_.size()));
  }

  void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
               ModeEffects& fx) override {
    const std::string before = status.SerializeAsString();
    if (members_.count(peer.id) == 0) metrics_.gossip.members.Increment();
    Member& m = members_[peer.id];
    m = Member{};
    m.address = peer.address;
    // A peer that finished before (e.g. it reconnected) stays finished: its runner will not
    // train again.
    if (auto it = finished_.find(peer.id); it != finished_.end()) {
      m.step = it->second.step;
      m.clock = it->second.clock;
      m.loss = it->second.loss;
      m.done = true;
      m.evaluated = evals_.count(peer.id) > 0;
    }
    if (members_.size() == 1 && !started_) round_start_ = now;
    Broadcast(now, fx);
    Publish(before, now, status, fx);
  }

  void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                  v1::TaskStatus& status, ModeEffects& fx) override {
    const std::string before = status.SerializeAsString();
    if (members_.erase(peer_id) == 0) return;
    metrics_.gossip.members.Decrement();
    LogInfo("task ", task_, ": gossip peer ", peer_id, " left (", why, ")");
    Broadcast(now, fx);
    AppendRounds(now, fx);
    MaybeComplete(now, fx);
    Publish(before, now, status, fx);
  }

  absl::Status OnMessage(const std::string& peer_id, const v1::PeerMessage& message, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override {
    const std::string before = status.SerializeAsString();
    auto it = members_.find(peer_id);
    if (it == members_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("peer ", peer_id, " is not a member of gossip task ", task_));
    }
    Member& m = it->second;
    if (message.has_gossip_progress()) {
      const v1::GossipProgress& p = message.gossip_progress();
      if (!std::isfinite(p.clock()) || p.clock() < 0 || !std::isfinite(p.loss()) || p.loss() < 0) {
        return absl::InvalidArgumentError("gossip progress: clock and loss must be finite, >= 0");
      }
      if (p.step() > total_steps_) {
        return absl::InvalidArgumentError(
            absl::StrCat("gossip progress: step ", p.step(), " beyond the task's ", total_steps_));
      }
      // A finished peer may announce its result again before enough members are back (after a
      // coordinator restart); other progress before the start is stale.
      if (!started_ && !p.done()) {
        return absl::FailedPreconditionError("gossip progress before the task started");
      }
      metrics_.gossip.progress_reports.Increment();
      if (p.fetches() > m.fetches) metrics_.gossip.peer_fetches.Increment(p.fetches() - m.fetches);
      if (p.bytes_pulled() > m.bytes_pulled) {
        metrics_.gossip.peer_bytes_pulled.Increment(
            static_cast<double>(p.bytes_pulled() - m.bytes_pulled));
      }
      m.fetches = p.fetches();
      m.bytes_pulled = p.bytes_pulled();
      m.step = std::max(m.step, p.step());
      m.clock = p.clock();
      m.loss = p.loss();
      m.reported = true;
      if (p.done() && !m.done) {
        m.done = true;
        metrics_.gossip.peers_done.Increment();
        finished_[peer_id] = Finished{m.step, m.clock, m.loss};
      }
      AppendRounds(now, fx);
      UpdateGauges();
      MaybeComplete(now, fx);
      Publish(before, now, status, fx);
      return absl::OkStatus();
    }
    if (message.has_eval_report()) {
      // The core credited it to a history entry if one has this version; the final entry is
      // only written below, with the reports of every member.
      const v1::EvalReport& r = message.eval_report();
      if (!m.done) {
        return absl::FailedPreconditionError("gossip eval report before the peer is done");
      }
      evals_[peer_id] = r;
      m.evaluated = true;
      MaybeComplete(now, fx);
      Publish(before, now, status, fx);
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat("message not used by gossip task ", task_));
  }

  void Tick(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) override {
    const std::string before = status.SerializeAsString();
    MaybeComplete(now, fx);
    Publish(before, now, status, fx);
  }

 private:
  struct Member {
    std::string address;
    uint64_t step = 0;
    double clock = 0;
    double loss = 0;
    bool reported = false;  // sent a GossipProgress since it joined
    bool done = false;
    bool evaluated = false;
    uint64_t fetches = 0;
    uint64_t bytes_pulled = 0;
  };
  struct Finished {
    uint64_t step = 0;
    double clock = 0, loss = 0;
  };

  uint32_t need() const { return std::max<uint32_t>(1, spec_.min_participants()); }

  bool AllDone() const {
    if (members_.empty()) return false;
    for (const auto& [id, m] : members_) {
      if (!m.done) return false;
    }
    return true;
  }

  // Membership changed (or a member reconnected): everyone learns the new list. Before the
  // first start, fewer than min_participants members are told to wait.
  void Broadcast(absl::Time now, ModeEffects& fx) {
    if (finished_task_) return;
    if (!started_ && members_.size() < need()) {
      for (const auto& [id, m] : members_) {
        v1::CoordinatorEvent e;
        e.mutable_waiting()->set_have(static_cast<uint32_t>(members_.size()));
        e.mutable_waiting()->set_need(need());
        fx.Send(id, std::move(e));
      }
      return;
    }
    if (members_.empty()) return;
    if (!started_) {
      started_ = true;
      round_start_ = now;
      LogInfo("task ", task_, ": gossip starts with ", members_.size(), " peers");
    }
    v1::CoordinatorEvent e;
    auto& g = *e.mutable_gossip_members();
    g.set_start(true);
    for (const auto& [id, m] : members_) {  // ascending id
      v1::PeerEndpoint* p = g.add_peers();
      p->set_peer_id(id);
      p->set_address(m.address);
    }
    for (const auto& [id, m] : members_) {
      fx.Send(id, e);
      metrics_.gossip.membership_updates.Increment();
    }
  }

  uint64_t SlowestStep() const {
    uint64_t slowest = UINT64_MAX;
    for (const auto& [id, m] : members_) slowest = std::min(slowest, m.step);
    return members_.empty() ? 0 : slowest;
  }

  double MeanLoss() const {
    double sum = 0;
    int n = 0;
    for (const auto& [id, m] : members_) {
      if (!m.reported) continue;
      sum += m.loss;
      ++n;
    }
    return n == 0 ? 0 : sum / n;
  }

  void UpdateGauges() {
    metrics_.gossip.slowest_step.Set(static_cast<double>(SlowestStep()));
    metrics_.gossip.mean_loss.Set(MeanLoss());
  }

  v1::RoundSummary Summary(uint64_t round, absl::Time now) const {
    v1::RoundSummary s;
    s.set_round(round);
    s.set_model_version(round);
    for (const auto& [id, m] : members_) s.add_participants(id);
    s.set_mean_train_loss(MeanLoss());
    s.set_num_samples(static_cast<uint64_t>(members_.size()) * spec_.round_batches() *
                      spec_.batch_size());
    s.set_duration_ms(absl::ToInt64Milliseconds(now - round_start_));
    return s;
  }

  // A "round" r of a gossip task is done when every member trained r x round_batches steps.
  // Rounds before the last are summarized as they pass; the last one when the task completes
  // (with the members' evaluations).
  void AppendRounds(absl::Time now, ModeEffects& fx) {
    if (!started_ || members_.empty()) return;
    const uint64_t slowest = SlowestStep();
    while (completed_ + 1 < spec_.rounds() && (completed_ + 1) * spec_.round_batches() <= slowest) {
      ++completed_;
      fx.rounds_completed.push_back(Summary(completed_, now));
      round_start_ = now;
    }
  }

  void MaybeComplete(absl::Time now, ModeEffects& fx) {
    if (finished_task_ || (!started_ && members_.size() < need())) return;
    if (!AllDone()) {
      all_done_at_ = absl::InfinitePast();
      return;
    }
    if (all_done_at_ == absl::InfinitePast()) all_done_at_ = now;
    bool all_evaluated = true;
    for (const auto& [id, m] : members_) all_evaluated = all_evaluated && m.evaluated;
    if (!all_evaluated && now - all_done_at_ < kFinalEvalTimeout) return;
    finished_task_ = true;
    completed_ = spec_.rounds();
    v1::RoundSummary s = Summary(completed_, now);
    uint64_t correct = 0, total = 0;
    double loss_sum = 0;
    for (const auto& [id, r] : evals_) {
      correct += r.correct();
      total += r.total();
      loss_sum += r.loss_sum();
    }
    if (total > 0) {
      s.set_evaluated(true);
      s.set_evaluation_complete(true);
      s.set_test_samples(total);
      s.set_test_accuracy(static_cast<double>(correct) / static_cast<double>(total));
      s.set_test_loss(loss_sum / static_cast<double>(total));
      metrics_.test_accuracy.Set(s.test_accuracy());
    }
    fx.rounds_completed.push_back(s);
    fx.finish = {v1::TASK_STATE_COMPLETED,
                 absl::StrCat("every peer trained ", total_steps_, " steps; mean test accuracy ",
                              total > 0 ? absl::StrCat(s.test_accuracy()) : "n/a", " over ",
                              evals_.size(), " peers")};
    LogInfo("task ", task_, ": gossip completed (", fx.finish->second, ")");
  }

  void Publish(const std::string& before, absl::Time now, v1::TaskStatus& status, ModeEffects& fx) {
    if (!finished_task_) {
      const uint64_t slowest = SlowestStep();
      status.set_model_version(completed_);
      status.set_round(std::min<uint64_t>(completed_ + 1, spec_.rounds()));
      if (!started_) {
        status.set_state(v1::TASK_STATE_WAITING);
        status.set_phase(v1::ROUND_PHASE_UNSPECIFIED);
        status.set_message(
            absl::StrCat("waiting for peers (", members_.size(), " of ", need(), ")"));
      } else if (AllDone()) {
        status.set_state(v1::TASK_STATE_RUNNING);
        status.set_phase(v1::ROUND_PHASE_EVALUATING);
        status.set_message("gossip: every peer is done; collecting evaluations");
      } else {
        status.set_state(v1::TASK_STATE_RUNNING);
        status.set_phase(v1::ROUND_PHASE_GOSSIPING);
        status.set_message(absl::StrCat("gossip: ", members_.size(), " peers, slowest at step ",
                                        slowest, " of ", total_steps_));
      }
    }
    if (privacy_.enabled()) {
      std::map<std::string, uint64_t> steps;
      for (const auto& [id, m] : members_) steps[id] = m.step;
      privacy_.Update(steps, completed_, status);
    }
    status.clear_peers();
    for (const auto& [id, m] : members_) {
      v1::PeerProgress* p = status.add_peers();
      p->set_peer_id(id);
      p->set_state(!started_ ? "waiting" : m.done ? "done" : "training");
      p->set_step(m.step);
      p->set_clock(m.clock);
      p->set_loss(m.loss);
    }
    if (!fx.rounds_completed.empty() || status.SerializeAsString() != before) fx.changed = true;
  }

  const std::string task_;
  const common::v1::TaskSpec spec_;
  CoordinatorMetrics& metrics_;
  GossipPrivacy privacy_;  // privacy.dp at level sample: the epsilon the peers' steps spent
  const uint64_t total_steps_;

  std::map<std::string, Member> members_;        // ordered: deterministic member lists
  std::map<std::string, Finished> finished_;     // peers that reported done (kept if they leave)
  std::map<std::string, v1::EvalReport> evals_;  // their evaluations
  bool started_ = false;
  bool finished_task_ = false;
  uint64_t completed_ = 0;  // rounds summarized
  absl::Time round_start_ = absl::InfinitePast();
  absl::Time all_done_at_ = absl::InfinitePast();
};

}  // namespace

std::unique_ptr<ModeTask> MakeGossipTask(const v1::TaskStatus& status,
                                         const ModeOptions& /*options*/,
                                         CoordinatorMetrics& metrics) {
  return std::make_unique<GossipTask>(status, metrics);
}

}  // namespace shoal::coordinator
