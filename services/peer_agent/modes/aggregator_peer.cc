#include "services/peer_agent/modes/aggregator_peer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/frame_codec.h"
#include "services/peer_agent/reports.h"

namespace shoal::peer {

AggregatorPeer::AggregatorPeer(const ModeRunnerDeps& deps, AggregatorCallOptions options)
    : deps_(deps),
      options_(std::move(options)),
      task_(deps.assigned.spec().name()),
      trainer_(*deps.trainer),
      snapshots_(*deps.snapshots),
      aggregator_(*deps.aggregator),
      metrics_(*deps.metrics),
      clock_(*deps.clock),
      wakeup_(*deps.wakeup),
      address_(deps.assigned.aggregator_address()) {}

bool AggregatorPeer::Reassign(const std::string& address) {
  if (address == address_) {
    LogInfo("task ", task_, ": assigned again (aggregator ", address_, ")");
    return false;
  }
  LogInfo("task ", task_, ": assigned again, now through the aggregator at ", address, " (was ",
          address_, ")");
  address_ = address;
  return true;
}

aggregator::Caller AggregatorPeer::Me() const {
  // The aggregator accepts this peer's calls only with the current session's token.
  return aggregator::Caller{deps_.peer_id, deps_.session_token ? deps_.session_token() : ""};
}

bool AggregatorPeer::TaskCurrent() const { return !deps_.task_current || deps_.task_current(); }

void AggregatorPeer::UploadInitialModel(absl::Time deadline) {
  absl::StatusOr<tensor::FlatModel> init = trainer_.InitialParameters();
  absl::Status status = init.status();
  std::shared_ptr<const tensor::FlatModel> model;
  if (status.ok()) {
    model = std::make_shared<const tensor::FlatModel>(*std::move(init));
    const common::v1::ModelMeta meta = tensor::MakeModelMeta(task_, 0, *model);
    const std::string address = address_;
    status = RetryCall(
                 deadline, [this] { return TaskCurrent(); },
                 [&](absl::Time attempt_deadline) {
                   return aggregator_.PutModel(address, meta, model, Me(), attempt_deadline);
                 })
                 .status();
  }
  if (!status.ok()) {
    LogError("task ", task_, ": could not upload the initial model: ", status.message());
    deps_.send(MakePeerError(0, status));
    return;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(model->layout.total_bytes()));
  if (absl::Status s = trainer_.SetParameters(*model); !s.ok()) {
    LogError("task ", task_, ": ", s.message());
    deps_.send(MakePeerError(0, s));
    return;
  }
  global_version_ = 0;
  global_ = *model;
  params_are_global_ = true;
  snapshots_.Publish(Snapshot{task_, 0, model});
  LogInfo(absl::StrFormat("task %s: initial model uploaded (%d parameters, digest %016x)", task_,
                          model->values.size(), model->Digest()));
  coordinator::v1::PeerMessage out;
  out.mutable_model_initialized()->set_digest_xxh3(model->Digest());
  deps_.send(out);
}

absl::StatusOr<bool> AggregatorPeer::LoadGlobal(uint64_t version, absl::Time deadline,
                                                const std::function<bool()>& keep_going) {
  if (global_version_ == version) {
    if (!params_are_global_) {
      SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(global_));
      params_are_global_ = true;
    }
    return false;
  }
  const std::string address = address_;
  SHOAL_ASSIGN_OR_RETURN(
      tensor::FlatModel model, RetryCall(deadline, keep_going, [&](absl::Time attempt_deadline) {
        return aggregator_.GetModel(address, task_, version, Me(), attempt_deadline);
      }));
  metrics_.bytes_received.Increment(static_cast<double>(model.layout.total_bytes()));
  SHOAL_RETURN_IF_ERROR(trainer_.SetParameters(model));
  global_version_ = version;
  global_ = std::move(model);
  params_are_global_ = true;
  return true;
}

std::shared_ptr<tensor::FlatModel> AggregatorPeer::DeltaOf(const tensor::FlatModel& params) const {
  auto delta = std::make_shared<tensor::FlatModel>();
  delta->layout = params.layout;
  delta->values.resize(params.values.size());
  const std::vector<float>& base = global_.values;
  for (size_t i = 0; i < delta->values.size(); ++i) delta->values[i] = params.values[i] - base[i];
  // Test-only: a Byzantine peer pushes a corrupted delta; what it keeps is its own model.
  deps_.byzantine.CorruptDelta(delta->values);
  return delta;
}

}  // namespace shoal::peer
