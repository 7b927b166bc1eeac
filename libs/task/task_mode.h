#pragma once

// Training modes: one ModeDefinition per value of TaskSpec's Mode enum (but UNSPECIFIED, which
// means the default, federated-sync), in libs/task/task_mode.cc. Everything outside the mode
// folders (services/coordinator/modes/<mode>/, services/peer_agent/modes/<mode>/) that depends
// on a task's mode reads its definition: task-file defaults and validation, the round size the
// aggregation strategy may count on, `shoalctl local` (whether to start aggregators) and
// shoalctl's tables. tests/unit/task_mode_test.cc checks that every enum value has exactly one.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::task {

// The fewest updates a round of a task aggregates, and the task field that says so, e.g.
// {4, "min_participants"}.
struct RoundSize {
  uint64_t updates = 0;
  std::string field;
};

// The task-file settings that only some modes accept. A task that sets one its mode does not
// accept is refused, naming the modes that do.
struct ModeSections {
  // The mode's own settings message (a TaskSpec field: "gossip", "async"), which no other mode
  // accepts; empty for none.
  std::string own;
  bool compression = false;  // compression and topk_*: its peers send updates to compress
  bool stragglers = false;   // straggler_factor, straggler_rounds
  bool tree = false;         // topology: hierarchical, cluster_size, fanout
  bool backups = false;      // replicas > 1 on a tree
  bool dp_sample = false;    // privacy.dp at level sample (DP-SGD on each peer)
  bool dp_peer = false;      // privacy.dp at level peer (clipped updates, Gaussian noise)
  // Level peer without an aggregator: each peer adds the noise to the update it serves, the full
  // noise (noise central) or, only with secure aggregation, its share (noise distributed).
  bool dp_noise_at_peers = false;
  // Why the mode does not take level peer, shown when a task asks for it ("" when it does).
  std::string dp_peer_refusal;
  // privacy.dp.target_epsilon: the coordinator ends the task before a round passes it.
  bool dp_target_epsilon = false;
  bool secure_aggregation = false;  // privacy.secure_aggregation (SecAgg+)
};

// A column of shoalctl's round table (`task status`, `task summary`, `task history`);
// services/shoalctl/task_format.cc renders each.
enum class RoundColumn {
  kRound,         // round number
  kVersion,       // model version (federated-async counts versions, not rounds)
  kPeers,         // participants
  kPeersAndLate,  // participants, late (async) contributors after a '+': "3+1"
  kUpdates,       // updates in the version
  kDropped,       // expected peers that missed the round
  kStaleness,     // mean staleness of the version's updates
  kJoins,         // decentralized: peers that joined, left, connection retries, removed peers
  kLeaves,
  kRetries,
  kRemoved,
  kTrainLoss,     // mean train loss
  kTestAccuracy,  // test accuracy, "-" when not evaluated
  kDuration,      // the round's wall time
  kOverhead,      // decentralized: first ready -> last participant holding the average
  kMoved,         // bytes the round moved (model downloads and updates)
  kTrainTime,     // the contributors' median training time
  kCommTime,      // and the median of the rest of their time (download, delta, push)
};

// What shoalctl's `task status` shows on each peer's line.
enum class PeerColumn {
  kModelRound,   // "model of round N"
  kUpdates,      // "updates in published versions: N"
  kGossipClock,  // "step N  clock C  loss L"
};

struct ModeDefinition {
  common::v1::Mode mode = common::v1::MODE_UNSPECIFIED;
  // As task files write it ("federated-sync"): the enum value's friendly name.
  std::string name;
  // Its tasks run through an aggregator: the coordinator gives them one (CoordinatorCore's
  // Task::UsesAggregator) and `shoalctl local` starts aggregators for them.
  bool uses_aggregator = false;
  ModeSections sections;
  // Fills its settings that a task shows even when the file leaves them out (null: none).
  void (*apply_defaults)(common::v1::TaskSpec& spec) = nullptr;
  // Checks its settings (defaults applied). INVALID_ARGUMENT "<field>: <what>" (null: none).
  absl::Status (*validate)(const common::v1::TaskSpec& spec) = nullptr;
  // The fewest updates its rounds aggregate (before a tree splits them into clusters): what an
  // aggregation strategy may count on. Null: the mode aggregates no rounds, so only the default
  // strategy, mean, applies.
  RoundSize (*round_size)(const common::v1::TaskSpec& spec) = nullptr;
  // shoalctl: what the task counts ("round", "version"), the round table's columns left to
  // right, and each peer's line.
  std::string step = "round";
  std::vector<RoundColumn> round_columns;
  PeerColumn peer_column = PeerColumn::kModelRound;
};

// Every definition, in the order of the enum.
const std::vector<ModeDefinition>& ModeDefinitions();
// The definition of `mode`; nullptr for UNSPECIFIED and numbers the enum lacks.
const ModeDefinition* FindModeDefinition(common::v1::Mode mode);
// The definition of `mode`, or the default mode's (federated-sync) for UNSPECIFIED, which means
// the default, and for numbers the enum lacks (for displays, which show what they can).
const ModeDefinition& ModeDefinitionOrDefault(common::v1::Mode mode);

// The names of the modes whose definition passes `has`, joined by `separator`, e.g.
// "federated-sync, federated-async".
std::string ModeNames(bool (*has)(const ModeDefinition& mode), const char* separator = ", ");

// The round size of `spec` for its strategy: its mode's, capped by cluster_size on a tree (a
// strategy runs within each cluster). updates 0: the mode aggregates no rounds, or its mode is
// unknown.
RoundSize RoundSizeOf(const common::v1::TaskSpec& spec);

}  // namespace shoal::task
