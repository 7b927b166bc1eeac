#pragma once

// Helpers and the fixture of the DecentralizedTask tests (decentralized_task_test.cc,
// decentralized_resume_test.cc): the coordinator's decentralized round state machine driven
// event by event with explicit times.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "services/coordinator/modes/decentralized/decentralized_task.h"

namespace shoal::coordinator::decentralized_testing {

using Kind = v1::CoordinatorEvent::KindCase;

inline constexpr Kind kRoundOpen = v1::CoordinatorEvent::kRoundOpen;
inline constexpr Kind kJoinRefused = v1::CoordinatorEvent::kJoinRefused;
inline constexpr Kind kPeerList = v1::CoordinatorEvent::kPeerList;
inline constexpr Kind kStartSharing = v1::CoordinatorEvent::kStartSharing;
inline constexpr Kind kConnectionFailed = v1::CoordinatorEvent::kConnectionFailed;
inline constexpr Kind kSyncFrom = v1::CoordinatorEvent::kSyncFrom;
inline constexpr Kind kSyncServe = v1::CoordinatorEvent::kSyncServe;
inline constexpr Kind kWaiting = v1::CoordinatorEvent::kWaiting;
inline constexpr Kind kModelPublished = v1::CoordinatorEvent::kModelPublished;

inline common::v1::TaskSpec Spec(uint32_t min, uint32_t rounds, uint32_t retries = 3) {
  common::v1::TaskSpec spec;
  spec.set_name("d");
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_model("mlp");
  spec.set_batch_size(32);
  spec.set_round_batches(5);
  spec.set_rounds(rounds);
  spec.set_min_participants(min);
  spec.set_round_deadline_seconds(30);
  spec.set_max_connection_retry(retries);
  spec.set_seed(1);
  return spec;
}

inline v1::PeerMessage Held(uint64_t round, uint64_t digest = 0) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_model_held()->set_round(round);
  m.mutable_model_held()->set_digest_xxh3(digest);
  return m;
}

inline v1::PeerMessage Join(uint64_t round, uint64_t offer = 0) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_join_round()->set_round(round);
  m.mutable_join_round()->set_offer(offer);
  return m;
}

inline v1::PeerMessage Ready(uint64_t round, uint64_t samples = 100, double loss = 0.5) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_round_ready()->set_round(round);
  m.mutable_round_ready()->set_num_samples(samples);
  m.mutable_round_ready()->set_train_loss(loss);
  return m;
}

inline v1::PeerMessage Report(uint64_t round, uint32_t attempt,
                              std::vector<std::string> unreachable) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_connections_report()->set_round(round);
  m.mutable_connections_report()->set_attempt(attempt);
  for (const auto& u : unreachable) m.mutable_connections_report()->add_unreachable(u);
  return m;
}

inline v1::PeerMessage Shared(uint64_t round, uint32_t attempt, uint64_t digest = 0xabc) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_sharing_done()->set_round(round);
  m.mutable_sharing_done()->set_attempt(attempt);
  m.mutable_sharing_done()->set_digest_xxh3(digest);
  return m;
}

inline v1::PeerMessage Synced(uint64_t round, const std::string& provider, bool ok) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_sync_done()->set_round(round);
  m.mutable_sync_done()->set_provider(provider);
  m.mutable_sync_done()->set_ok(ok);
  m.mutable_sync_done()->set_duration_ms(120);
  if (!ok) m.mutable_sync_done()->set_message("connection refused");
  return m;
}

inline v1::PeerMessage Eval(uint64_t version) {
  v1::PeerMessage m;
  m.set_task("d");
  m.mutable_eval_report()->set_version(version);
  m.mutable_eval_report()->set_correct(8);
  m.mutable_eval_report()->set_total(10);
  return m;
}

class DecentralizedTaskTest : public ::testing::Test {
 protected:
  void Make(const common::v1::TaskSpec& spec) {
    status_ = v1::TaskStatus();
    *status_.mutable_spec() = spec;
    status_.set_state(v1::TASK_STATE_WAITING);
    task_ = std::make_unique<DecentralizedTask>(status_, metrics_);
  }

  ModeEffects Add(const std::string& id) {
    ModeEffects fx;
    task_->AddPeer(ModePeer{id, "127.0.0.1:" + std::to_string(9000 + id[0])}, now_, status_, fx);
    return Keep(std::move(fx));
  }
  ModeEffects Remove(const std::string& id) {
    ModeEffects fx;
    task_->RemovePeer(id, "test", now_, status_, fx);
    return Keep(std::move(fx));
  }
  ModeEffects Send(const std::string& id, const v1::PeerMessage& m,
                   absl::StatusCode code = absl::StatusCode::kOk) {
    ModeEffects fx;
    absl::Status s = task_->OnMessage(id, m, now_, status_, fx);
    EXPECT_EQ(s.code(), code) << s;
    return Keep(std::move(fx));
  }
  ModeEffects Tick(absl::Duration advance) {
    now_ += advance;
    ModeEffects fx;
    task_->Tick(now_, status_, fx);
    return Keep(std::move(fx));
  }
  // As the core does: completed rounds go to the history.
  ModeEffects Keep(ModeEffects fx) {
    for (const auto& r : fx.rounds_completed) *status_.add_history() = r;
    return fx;
  }

  // Kinds of the events for `peer`, in order.
  static std::vector<Kind> Kinds(const ModeEffects& fx, const std::string& peer) {
    std::vector<Kind> kinds;
    for (const auto& [id, e] : fx.events) {
      if (id == peer) kinds.push_back(e.kind_case());
    }
    return kinds;
  }
  static std::vector<v1::CoordinatorEvent> Events(const ModeEffects& fx, const std::string& peer,
                                                  Kind kind) {
    std::vector<v1::CoordinatorEvent> out;
    for (const auto& [id, e] : fx.events) {
      if (id == peer && e.kind_case() == kind) out.push_back(e);
    }
    return out;
  }
  static std::vector<std::string> Ids(const v1::PeerList& list) {
    std::vector<std::string> ids;
    for (const auto& p : list.participants()) ids.push_back(p.peer_id());
    return ids;
  }
  std::string PeerState(const std::string& id) const {
    for (const auto& p : status_.peers()) {
      if (p.peer_id() == id) return p.state();
    }
    return "absent";
  }

  // Adds `ids` holding the initial model; with enough of them round 1 opens.
  void AddSynced(const std::vector<std::string>& ids) {
    for (const auto& id : ids) {
      Add(id);
      Send(id, Held(0));
    }
  }
  // Runs round `r` with `ids` joined, ready, connected and done: returns the last effects.
  ModeEffects RunRound(uint64_t r, const std::vector<std::string>& ids) {
    for (const auto& id : ids) Send(id, Join(r));
    ModeEffects fx;
    for (const auto& id : ids) fx = Send(id, Ready(r));
    const uint32_t attempt = Events(fx, ids[0], kPeerList).at(0).peer_list().attempt();
    for (const auto& id : ids) Send(id, Report(r, attempt, {}));
    for (const auto& id : ids) fx = Send(id, Shared(r, attempt));
    return fx;
  }

  prometheus::Registry registry_;
  CoordinatorMetrics metrics_{registry_};
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  v1::TaskStatus status_;
  std::unique_ptr<DecentralizedTask> task_;
};

}  // namespace shoal::coordinator::decentralized_testing
