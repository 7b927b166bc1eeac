#pragma once

// AggregatorCore's per-task state, shared by aggregator_core.cc, aggregator_rounds.cc and
// aggregator_buffer.cc. Not part of the API: include aggregator_core.h.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/aggregation/strategy.h"
#include "libs/tensor/flat_model.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/round_aggregation.h"
#include "services/aggregator/update_buffer.h"

namespace shoal::aggregator {

// The round a task is in. Fields are guarded by AggregatorCore::mu_, except `aggregation`,
// which folds touch under `fold_mu` while the round is open and CloseRound owns once it is
// kClosing with no fold in flight.
struct AggregatorCore::Round {
  enum class State { kOpen, kClosing, kClosed, kAbandoned };

  uint64_t number = 0;
  uint64_t base_version = 0;
  std::shared_ptr<const tensor::FlatModel> base;
  std::set<std::string> expected;
  std::set<std::string> late;                    // stragglers: one late update each
  std::set<std::string> children;                // tree rounds: child supernodes expected
  std::set<std::string> children_in;             // children whose partial sums were accepted
  std::shared_ptr<const PartialResult> partial;  // set when ClosePartial closed it
  v1::ParentRound parent;                        // a child's round: where its partial goes
  // Replicas: a primary's backups (it copies each accepted update there before answering);
  // on a backup, the primary's child id (kept once promoted: its copies in flight still count)
  // and whether it is still a standby (takes only the primary's copies).
  std::vector<std::string> backups;
  std::string replica_id;  // what a primary's copies carry as replicated_by
  std::string primary;
  bool standby = false;
  common::v1::AsyncSpec late_staleness;  // their staleness bound and weighting
  double max_norm = 0;
  // Differential privacy (round_privacy.h): level unspecified for none; dp_expected is the
  // fixed denominator, the peers expected at the open.
  common::v1::DpSpec dp;
  size_t dp_expected = 0;
  std::optional<aggregation::Strategy> strategy;  // set by OpenRound
  State state = State::kOpen;
  std::set<std::string> accepted;  // peers whose updates were accepted
  std::set<std::string> pushing;   // peers with a push in progress
  int folds_in_flight = 0;         // accepted pushes whose fold has not finished
  absl::Status fold_error;         // first failed fold (an invariant broke); the round cannot close
  uint64_t num_samples = 0;
  double loss_sum = 0;  // sum of train_loss * num_samples
  absl::Time opened_at;

  absl::Mutex fold_mu;
  std::unique_ptr<RoundAggregation> aggregation;
};

struct AggregatorCore::Task {
  struct Version {
    std::shared_ptr<const tensor::FlatModel> model;
    uint64_t digest = 0;
  };
  std::string name;
  std::map<uint64_t, Version> versions;  // guarded by AggregatorCore::mu_ (as all fields)
  uint64_t latest = 0;
  std::shared_ptr<Round> round;            // the current (or last) round
  std::map<uint64_t, RoundResult> closed;  // results of recently closed rounds
  // Federated-async: set by OpenBuffer, and from then on the task has no rounds. Replaced (not
  // emptied in place) on a reset, so that pushes and passes of the old one see they are stale.
  std::shared_ptr<UpdateBuffer> buffer;
  // Stragglers: the UpdateMeta.round of each one's last accepted late update (a repeat of it,
  // into whatever round, is a duplicate).
  std::map<std::string, uint64_t> late_rounds;
  // Tree rounds: every child named in the task's rounds; each may read the task's models
  // (a child fetches the base version of its next round from here).
  std::set<std::string> children;
  // Replicas: per child, the backups that may act as it (from the rounds' child_backups).
  std::map<std::string, std::set<std::string>> child_backups;
  bool released = false;
};

// Where BeginPush sends a push: its round or its buffer, and how to decode it.
struct AggregatorCore::PushTarget {
  std::shared_ptr<Round> round;
  std::shared_ptr<UpdateBuffer> buffer;
  std::shared_ptr<const tensor::FlatModel> model;  // the deltas' layout
  double max_norm = 0;
  double staleness_factor = 1;                     // a late round update's
  RejectReason reason = RejectReason::kMalformed;  // when the target refuses the push
  bool duplicate = false;                          // an accepted round push, again
};

// "open", "closing", ... for messages.
const char* RoundStateName(const AggregatorCore::Round& round);

// "task 'name'" with the name escaped, for messages.
std::string TaskLabel(const std::string& task);
// "round N of task 'name'".
std::string RoundLabel(uint64_t round, const std::string& task);

// What a round or a buffer opens on: OK when `base_version` is the task's latest version;
// FAILED_PRECONDITION naming it and the latest when it is not held or not the latest.
absl::Status CheckBaseIsLatest(const AggregatorCore::Task& task, const std::string& name,
                               uint64_t base_version);

}  // namespace shoal::aggregator
