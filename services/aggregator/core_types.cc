#include "services/aggregator/core_types.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::aggregator {

PushMeta PushMeta::From(const v1::UpdateMeta& m, std::string caller_identity) {
  PushMeta meta{m.task(),        m.round(),      m.peer_id(),       m.base_version(),
                m.num_samples(), m.train_loss(), m.session_token(), std::move(caller_identity)};
  meta.train_ms = m.train_ms();
  meta.replicated_by = m.replicated_by();
  return meta;
}

v1::UpdateMeta PushMeta::ToProto() const {
  v1::UpdateMeta m;
  m.set_task(task);
  m.set_round(round);
  m.set_peer_id(peer_id);
  m.set_base_version(base_version);
  m.set_num_samples(num_samples);
  m.set_train_loss(train_loss);
  m.set_session_token(session_token);
  m.set_train_ms(train_ms);
  m.set_replicated_by(replicated_by);
  return m;
}

OpenRoundParams OpenRoundParams::From(const v1::OpenRoundRequest& request) {
  OpenRoundParams params;
  params.task = request.task();
  params.round = request.round();
  params.base_version = request.base_version();
  params.expected_peers.assign(request.expected_peers().begin(), request.expected_peers().end());
  params.max_update_norm = request.max_update_norm();
  params.aggregation = request.aggregation();
  params.late_peers.assign(request.late_peers().begin(), request.late_peers().end());
  params.late_staleness = request.late_staleness();
  params.expected_children.assign(request.expected_children().begin(),
                                  request.expected_children().end());
  params.parent = request.parent();
  params.backups.assign(request.backups().begin(), request.backups().end());
  params.standby_for = request.standby_for();
  params.replica_id = request.replica_id();
  for (const v1::ChildBackup& b : request.child_backups()) {
    params.child_backups.emplace_back(b.child(), b.backup());
  }
  params.dp = request.dp();
  params.dp_round_peers = request.dp_round_peers();
  params.secure_aggregation = request.secure_aggregation();
  return params;
}

OpenBufferParams OpenBufferParams::From(const v1::OpenBufferRequest& request) {
  OpenBufferParams params;
  params.task = request.task();
  params.base_version = request.base_version();
  params.async = request.async();
  params.aggregation = request.aggregation();
  params.max_update_norm = request.max_update_norm();
  params.last_version = request.last_version();
  params.parent = request.parent();
  params.children.assign(request.children().begin(), request.children().end());
  return params;
}

v1::CloseRoundResponse RoundResult::ToProto() const {
  v1::CloseRoundResponse response;
  response.set_version(version);
  for (const auto& peer : contributors) response.add_contributors(peer);
  response.set_num_samples(num_samples);
  response.set_mean_train_loss(mean_train_loss);
  response.set_digest_xxh3(digest);
  response.set_note(note);
  response.set_model_bytes(model_bytes);
  return response;
}

absl::Status AggregatorCoreOptions::Validate() const {
  if (max_concurrent_pushes < 1 || max_concurrent_pushes > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_pushes must be in [1, 1024], got ", max_concurrent_pushes));
  }
  if (versions_kept < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("versions_kept must be >= 2, got ", versions_kept));
  }
  if (fold_threads < 1 || fold_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("fold_threads must be in [1, 64], got ", fold_threads));
  }
  if (closed_rounds_kept < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("closed_rounds_kept must be >= 1, got ", closed_rounds_kept));
  }
  if (max_buffer_bytes < 1) return absl::InvalidArgumentError("max_buffer_bytes must be >= 1");
  return absl::OkStatus();
}

}  // namespace shoal::aggregator
