#pragma once

// The aggregator core's requests and results (AggregatorCore, its sessions and the service
// share them): plain data, converted from and to the protos here.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::aggregator {

struct AggregatorCoreOptions {
  // Updates (and PutModel uploads) staged at once; each holds one model-sized buffer, so memory
  // is O(model x this), never O(model x peers).
  int max_concurrent_pushes = 4;
  // Model versions kept per task for GetModel (>= 2: the current and the previous).
  int versions_kept = 2;
  // Closed-round results kept per task for idempotent CloseRound.
  int closed_rounds_kept = 8;
  // Threads for the passes over a whole model (folding an update, applying the mean).
  int fold_threads = 2;
  // Bounds on models received with PutModel.
  tensor::DecoderLimits limits;
  // Update memory one round or federated-async buffer may hold (--max-buffer-bytes): a
  // non-streaming strategy holds its K updates (K x the model), a buffer K updates whatever the
  // strategy, mean's running sum one model. OpenRound/OpenBuffer answer RESOURCE_EXHAUSTED above
  // it. Staging buffers (max_concurrent_pushes) and the held model versions come on top.
  uint64_t max_buffer_bytes = uint64_t{4} << 30;

  absl::Status Validate() const;
};

struct PushMeta {
  std::string task;
  uint64_t round = 0;
  std::string peer_id;
  uint64_t base_version = 0;
  uint64_t num_samples = 0;
  double train_loss = 0;
  std::string session_token = "";    // UpdateMeta.session_token
  std::string caller_identity = "";  // the caller's TLS certificate name ("" for plaintext)
  int64_t train_ms = 0;              // UpdateMeta.train_ms
  std::string replicated_by = "";    // UpdateMeta.replicated_by: a primary's copy to its backup

  static PushMeta From(const v1::UpdateMeta& meta, std::string caller_identity);
  // The UpdateMeta this came from (caller_identity is not part of it).
  v1::UpdateMeta ToProto() const;
};

struct OpenRoundParams {
  std::string task;
  uint64_t round = 0;
  uint64_t base_version = 0;
  std::vector<std::string> expected_peers;
  double max_update_norm = 0;                // 0 = no bound
  v1::AggregationSettings aggregation = {};  // the round's strategy (unspecified: mean)
  // Stragglers: peers that may push one late update each (see OpenRoundRequest.late_peers).
  std::vector<std::string> late_peers = {};
  common::v1::AsyncSpec late_staleness = {};
  // Tree rounds: the child supernodes whose partial sums the round takes (AddPartial); mean
  // only; disjoint from the expected and late peers.
  std::vector<std::string> expected_children = {};
  // Tree rounds: set (address and child id) on a child's round, which closes into a partial sum
  // for that parent (ClosePartial) instead of publishing; mean only.
  v1::ParentRound parent = {};
  // Replicas: a primary's backups, or (standby_for, the primary's child id) a backup's round.
  std::vector<std::string> backups = {};
  std::string standby_for = "";
  // Replicas: (child, backup id) pairs: backups that may act as an expected child.
  std::vector<std::pair<std::string, std::string>> child_backups = {};
  std::string replica_id = "";  // the id a primary's copies carry (default: parent.child)
  // Differential privacy (level peer, see round_privacy.h); unset level: none.
  common::v1::DpSpec dp = {};
  // Differential privacy on a tree: the peers expected in the whole round (OpenRoundRequest.
  // dp_round_peers); 0 on a flat round.
  uint32_t dp_round_peers = 0;
  // Secure aggregation (sessions/secure_session.h); `enabled` false: none.
  v1::SecureAggregationSettings secure_aggregation = {};

  static OpenRoundParams From(const v1::OpenRoundRequest& request);
};

// AggregatorService.OpenBuffer (the proto's comments are the contract).
struct OpenBufferParams {
  std::string task;
  uint64_t base_version = 0;
  common::v1::AsyncSpec async;  // buffer_size required; unset fields take their defaults
  v1::AggregationSettings aggregation;
  double max_update_norm = 0;   // 0 = no bound
  uint64_t last_version = 0;    // 0 = no limit
  v1::ParentRound parent = {};  // a tree's node below the root: forwards, never publishes
  std::vector<std::string> children = {};

  static OpenBufferParams From(const v1::OpenBufferRequest& request);
};

struct RoundResult {
  uint64_t version = 0;
  std::vector<std::string> contributors;  // sorted
  uint64_t num_samples = 0;
  double mean_train_loss = 0;
  uint64_t digest = 0;
  std::string note;          // the strategy's AggregationReport.note (e.g. a degraded krum)
  uint64_t model_bytes = 0;  // of the version the round left

  v1::CloseRoundResponse ToProto() const;
};

// Whether a caller with certificate `identity` is child supernode `child`: the certificate's own
// name, or "NAME@ADDRESS" where aggregators share one certificate NAME (as in deploy/k8s): the
// coordinator then names each child by its address too.
inline bool IsChildOf(const std::string& identity, const std::string& child) {
  return child == identity ||
         (child.size() > identity.size() + 1 && child.compare(0, identity.size(), identity) == 0 &&
          child[identity.size()] == '@');
}

// Tree rounds: who a partial sum of a round holds. A child sends it to its parent with its id
// in `child`; ClosePartial returns one with `child` empty.
struct PartialMeta {
  std::string task;
  uint64_t round = 0;
  std::string child = "";
  uint64_t base_version = 0;
  std::vector<std::string> contributors = {};  // the peers summed, sorted: one term each
  uint64_t num_samples = 0;
  double loss_sum = 0;  // sum of train_loss x num_samples
};

struct PartialResult {
  PartialMeta meta;
  aggregation::PartialSum sum;
};

struct ModelSnapshot {
  uint64_t version = 0;
  std::shared_ptr<const tensor::FlatModel> model;
  // The version's tensors' digests, shared by every download of it (null: each hashes them).
  std::shared_ptr<tensor::TensorDigests> tensor_digests = nullptr;

  // `model` raw, with its tensors' digests.
  std::shared_ptr<const tensor::EncodedModel> Raw() const {
    if (tensor_digests == nullptr) return tensor::EncodeRaw(model);
    return tensor::EncodeRaw(model, tensor_digests->Of(*model));
  }
};

struct PutResult {
  uint64_t version = 0;
  uint64_t digest = 0;
};

// A push's complete update, as its session accepts and folds it.
struct PushedUpdate {
  PushMeta meta;
  std::vector<float> values;    // the decoded update
  double sum_squares = 0;       // of `values`
  double staleness_factor = 1;  // a late round update's delta is scaled by it
  uint64_t bytes_received = 0;
};

// Replicas: the copy of an accepted update a primary sends its backups (the peer's meta with
// replicated_by set, and the update); empty `backups` when the round has none.
struct PushReplica {
  std::vector<std::string> backups;
  v1::UpdateMeta meta;
  std::shared_ptr<const tensor::FlatModel> update;
};

}  // namespace shoal::aggregator
