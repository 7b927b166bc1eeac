#pragma once

// One task as CoordinatorCore holds it: its status, members and mode, the evaluation and error
// bookkeeping, and for a mode that runs through aggregators the links to them and the events
// waiting for their membership. Plain data under the core's lock; only the core uses it.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "libs/data/feature_moments.h"
#include "libs/task/task_mode.h"
#include "services/aggregator/aggregator_client.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/secure_statistics.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

struct CoreTask {
  // Whether its mode runs through an aggregator (the mode's definition, libs/task/task_mode.h):
  // the core then picks a registered aggregator (and another one when it is lost), tells it
  // the members and their session tokens before any work of the mode, watches it, and
  // releases the task there when it ends. False until the mode is made.
  bool UsesAggregator() const {
    return mode != nullptr && task::ModeDefinitionOrDefault(status.spec().mode()).uses_aggregator;
  }

  v1::TaskStatus status;  // history and everything reported; participants filled on read
  std::set<std::string> peers;
  std::unique_ptr<ModeTask> mode;
  // Model version -> the peers it was published to that have not reported its EvalReport yet.
  // A round's test_* are final (evaluation_complete) once its set is empty.
  std::map<uint64_t, std::set<std::string>> evaluating;
  // Rounds whose summary took EvalReports since it was last stored. Step() stores them, so a
  // round of N peers costs a few writes instead of N.
  std::set<uint64_t> unsaved_rounds;
  // A peer joined, left or reported its data since the status was last stored and watched:
  // Step() does both once, so N joins cost a few copies of the status instead of N (a
  // status holds every peer's data report).
  bool membership_dirty = false;
  // Peers that reported an error (PeerError) since the task last completed a round: not
  // assigned to it again before `retry_at` (1 s, doubling per error in a row, at most a
  // minute), so a peer that cannot take part does not bounce in and out; the task fails when
  // every peer has and nobody is left working on it.
  struct Errored {
    int count = 0;
    absl::Time retry_at;
    std::string message;
  };
  std::map<std::string, Errored> errored;
  // normalization standardize without the task's mean/std, until status.statistics are fixed:
  // the moments of the present peers that sent theirs (not stored: after a restart the peers
  // send them again when they are assigned again).
  std::map<std::string, data::FeatureMoments> moments;
  // The same with privacy.secure_aggregation: the masking of the peers' moments (not stored).
  std::unique_ptr<SecureStatistics> secure_moments;
  // --- Tasks whose mode uses an aggregator ---
  // Bumped whenever the aggregator changes or the task ends: results of older work, events
  // of older watches are dropped.
  uint64_t epoch = 0;
  // One aggregator of the task and what it was told. A task has none (waiting for one), or
  // its root (status.aggregator()) first and, with topology hierarchical, one per cluster,
  // each below the root or below another cluster's aggregator (fanout children each).
  struct Link {
    std::string address;
    std::string child;            // its id as its parent's child ("" for the root)
    size_t parent = 0;            // index in links of its parent (the root's: itself)
    uint32_t level = 0;           // 0: the root
    std::set<std::string> peers;  // hierarchical: its cluster (the root knows every peer)
    // Replicas (clusters below the root): its backups, the first taking over when `address`
    // is lost. Not watched: a lost backup is noticed when its registration expires.
    std::vector<std::string> backups;
    std::unique_ptr<aggregator::AggregatorWatch> watch;
    bool members_dirty = true;  // it must learn the current peers and tokens
    absl::Time members_retry_at = absl::InfinitePast();
    // SetMembers calls not answered yet (at most one from SendDirtyMembers: the changes made
    // while it is in flight go in the next call, which its answer sends).
    int members_in_flight = 0;
    // SetMembers calls numbered in order: the newest sent, and the newest confirmed.
    uint64_t members_sent = 0;
    uint64_t members_acked = 0;
    // The membership an event sent now needs: the call in flight, or the next when dirty.
    uint64_t MembersNeeded() const { return members_dirty ? members_sent + 1 : members_sent; }
  };
  std::vector<Link> links;
  std::map<std::string, size_t> cluster_of;  // hierarchical: peer -> its index in links
  // The mode's events wait, in order, until the aggregators have confirmed the membership
  // they need: a peer told to call an aggregator (InitializeModel, RoundStarted, ...) must
  // find its session token there.
  struct Held {
    std::string peer;
    v1::CoordinatorEvent event;
    std::vector<uint64_t> members;  // each link's MembersNeeded() when it was held
  };
  std::vector<Held> held;
  // Whether every link has confirmed the membership `needed` (indexed as links).
  bool MembersConfirmed(const std::vector<uint64_t>& needed) const {
    for (size_t i = 0; i < needed.size() && i < links.size(); ++i) {
      if (links[i].members_acked < needed[i]) return false;
    }
    return true;
  }
  // Each link's MembersNeeded(), indexed as links.
  std::vector<uint64_t> MembersNeeded() const {
    std::vector<uint64_t> needed;
    needed.reserve(links.size());
    for (const Link& link : links) needed.push_back(link.MembersNeeded());
    return needed;
  }
  std::optional<absl::Time> waiting_for_aggregator_since;
  // After a coordinator restart, until the task's model is restored: the aggregator the task
  // used before (from the store), which may still hold its newest version.
  std::string holder_before_restart;
  // Aggregators that held some of the task before its tree was dropped (an aggregator lost, the
  // tree rebuilt; not the lost one): freed once the model is restored on the new tree unless
  // they are among its aggregators again, or when the task ends.
  std::set<std::string> former_holders;
  // When its tree was last rebuilt on newly available aggregators (SupernodeOptions).
  absl::Time rebuilt_at = absl::InfinitePast();
};

}  // namespace shoal::coordinator
