// The training modes' definitions (libs/task/task_mode.h): one function per mode, and the table
// that lists them.

#include "libs/task/task_mode.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/async_spec.h"
#include "libs/gossip/gossip_spec.h"
#include "libs/task/task_federated.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;

constexpr uint32_t kDefaultMaxConnectionRetry = 3;
constexpr uint32_t kMaxConnectionRetry = 100;

RoundSize MinParticipants(const TaskSpec& spec) {
  return {spec.min_participants(), "min_participants"};
}

// Rounds through an aggregator: the model travels down, updates up.
ModeDefinition FederatedSync() {
  ModeDefinition m;
  m.mode = common::v1::MODE_FEDERATED_SYNC;
  m.name = "federated-sync";
  m.uses_aggregator = true;
  m.sections.compression = true;
  m.sections.stragglers = true;
  m.sections.tree = true;
  m.sections.backups = true;
  m.sections.dp_sample = true;
  m.sections.dp_peer = true;  // the aggregator adds the noise, or completes the peers' shares
  m.sections.dp_target_epsilon = true;
  m.sections.secure_aggregation = true;
  m.round_size = &MinParticipants;
  // What the round moved, and its contributors' median training and other time.
  m.round_columns = {RoundColumn::kRound,     RoundColumn::kPeersAndLate, RoundColumn::kDropped,
                     RoundColumn::kTrainLoss, RoundColumn::kTestAccuracy, RoundColumn::kDuration,
                     RoundColumn::kMoved,     RoundColumn::kTrainTime,    RoundColumn::kCommTime};
  return m;
}

// Rounds without an aggregator: peers exchange their updates all-to-all.
ModeDefinition Decentralized() {
  ModeDefinition m;
  m.mode = common::v1::MODE_DECENTRALIZED;
  m.name = "decentralized";
  m.sections.compression = true;
  m.sections.secure_aggregation = true;  // pairwise masks among the round's participants
  m.sections.dp_sample = true;
  // Every participant sees the others' updates (or with secure aggregation their sum) before
  // anyone else could add noise: each adds it to what it serves.
  m.sections.dp_peer = true;
  m.sections.dp_noise_at_peers = true;
  m.sections.dp_target_epsilon = true;
  m.apply_defaults = [](TaskSpec& spec) {
    if (!spec.has_max_connection_retry()) spec.set_max_connection_retry(kDefaultMaxConnectionRetry);
  };
  m.validate = [](const TaskSpec& spec) -> absl::Status {
    if (spec.max_connection_retry() > kMaxConnectionRetry) {
      return absl::InvalidArgumentError(absl::StrCat("max_connection_retry: must be in 0..",
                                                     kMaxConnectionRetry, ", got ",
                                                     spec.max_connection_retry()));
    }
    return absl::OkStatus();
  };
  m.round_size = &MinParticipants;
  // Joins, leaves, retries and removed peers, and the protocol's overhead.
  m.round_columns = {RoundColumn::kRound,     RoundColumn::kPeers,        RoundColumn::kJoins,
                     RoundColumn::kLeaves,    RoundColumn::kRetries,      RoundColumn::kRemoved,
                     RoundColumn::kTrainLoss, RoundColumn::kTestAccuracy, RoundColumn::kDuration,
                     RoundColumn::kOverhead};
  return m;
}

// Pairwise model averaging (dpwa), no rounds: its history is periodic evaluations.
ModeDefinition Gossip() {
  ModeDefinition m;
  m.mode = common::v1::MODE_GOSSIP;
  m.name = "gossip";
  m.sections.own = "gossip";
  m.sections.dp_sample = true;  // each peer's DP-SGD steps; the peers' step counts are charged
  m.sections.dp_peer_refusal =
      "a gossip peer serves its whole model, not an update of a round: no clip_norm bounds how "
      "one peer's data moves it (it interpolates with every model it fetched) and no round "
      "fixes how often it is released; use level sample (DP-SGD on each peer)";
  m.apply_defaults = [](TaskSpec& spec) { gossip::ApplyGossipDefaults(*spec.mutable_gossip()); };
  m.validate = [](const TaskSpec& spec) {
    return gossip::ValidateGossipSpec(spec.gossip(), "gossip");
  };
  // federated-sync's columns (the round is every member's round_batches more steps).
  m.round_columns = {RoundColumn::kRound,     RoundColumn::kPeersAndLate, RoundColumn::kDropped,
                     RoundColumn::kTrainLoss, RoundColumn::kTestAccuracy, RoundColumn::kDuration,
                     RoundColumn::kMoved,     RoundColumn::kTrainTime,    RoundColumn::kCommTime};
  m.peer_column = PeerColumn::kGossipClock;
  return m;
}

// A buffer of updates through an aggregator, no rounds: model versions.
ModeDefinition FederatedAsync() {
  ModeDefinition m;
  m.mode = common::v1::MODE_FEDERATED_ASYNC;
  m.name = "federated-async";
  m.uses_aggregator = true;
  m.sections.own = "async";
  m.sections.compression = true;
  m.sections.tree = true;
  m.apply_defaults = [](TaskSpec& spec) {
    aggregation::ApplyAsyncDefaults(*spec.mutable_async(), spec.min_participants());
  };
  m.validate = [](const TaskSpec& spec) {
    return aggregation::ValidateAsyncSpec(spec.async(), spec.max_participants(), "async");
  };
  m.round_size = [](const TaskSpec& spec) -> RoundSize {
    return {spec.async().has_buffer_size() ? spec.async().buffer_size() : spec.min_participants(),
            "async.buffer_size"};
  };
  m.step = "version";
  // The updates of each version and how stale they were, instead of dropped peers.
  m.round_columns = {RoundColumn::kVersion,   RoundColumn::kUpdates,      RoundColumn::kStaleness,
                     RoundColumn::kTrainLoss, RoundColumn::kTestAccuracy, RoundColumn::kDuration};
  m.peer_column = PeerColumn::kUpdates;
  return m;
}

}  // namespace

const std::vector<ModeDefinition>& ModeDefinitions() {
  // One line per mode, in the order of the enum.
  static const std::vector<ModeDefinition>* const modes = new std::vector<ModeDefinition>{
      FederatedSync(),
      Decentralized(),
      Gossip(),
      FederatedAsync(),
  };
  return *modes;
}

const ModeDefinition* FindModeDefinition(common::v1::Mode mode) {
  for (const ModeDefinition& m : ModeDefinitions()) {
    if (m.mode == mode) return &m;
  }
  return nullptr;
}

const ModeDefinition& ModeDefinitionOrDefault(common::v1::Mode mode) {
  const ModeDefinition* m = FindModeDefinition(mode);
  return m != nullptr ? *m : *FindModeDefinition(common::v1::MODE_FEDERATED_SYNC);
}

std::string ModeNames(bool (*has)(const ModeDefinition& mode), const char* separator) {
  std::vector<std::string> names;
  for (const ModeDefinition& m : ModeDefinitions()) {
    if (has(m)) names.push_back(m.name);
  }
  return absl::StrJoin(names, separator);
}

RoundSize RoundSizeOf(const TaskSpec& spec) {
  const ModeDefinition* m = FindModeDefinition(spec.mode());
  if (m == nullptr || m->round_size == nullptr) return {};
  RoundSize size = m->round_size(spec);
  // On a tree the strategy runs within each cluster: a full one is the most a round of it sees.
  if (IsHierarchical(spec) && spec.has_cluster_size() && spec.cluster_size() < size.updates) {
    size = {spec.cluster_size(), "cluster_size"};
  }
  return size;
}

}  // namespace shoal::task
