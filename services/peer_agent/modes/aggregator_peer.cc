#include "services/peer_agent/modes/aggregator_peer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/heap.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/retry.h"
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
      compressor_(CompressionOf(deps.assigned.spec())),
      privacy_(UpdatePrivacy::Create(deps.assigned.spec(), CentralNoise::kAtAggregator)),
      address_(deps.assigned.aggregator_address()) {
  if (const std::string how = DescribeCompression(compressor_); !how.empty()) {
    LogInfo("task ", task_, ": updates are compressed: ", how);
  }
  if (!privacy_.ok()) {
    LogError("task ", task_, ": ", privacy_.status().message());
  } else if (const std::string how = privacy_->Describe(); !how.empty()) {
    LogInfo("task ", task_, ": differential privacy: updates are ", how);
  }
}

void AggregatorPeer::UseAggregators(
    const google::protobuf::RepeatedPtrField<std::string>& aggregators) {
  if (aggregators.empty()) return;
  if (aggregators[0] != address_) {
    LogInfo("task ", task_, ": the cluster's aggregator is now ", aggregators[0], " (was ",
            address_, ")");
    address_ = aggregators[0];
  }
  backups_.assign(aggregators.begin() + 1, aggregators.end());
}

const std::string& AggregatorPeer::AddressFor(size_t attempt) const {
  const size_t k = attempt % (backups_.size() + 1);
  return k == 0 ? address_ : backups_[k - 1];
}

bool AggregatorPeer::Reassign(const std::string& address) {
  backups_.clear();
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

absl::Duration AggregatorPeer::TransferTimeout(uint64_t bytes) const {
  return rpc::TransferTimeout(options_.rpc_timeout, bytes, options_.slowest_link);
}

void AggregatorPeer::UploadInitialModel(const coordinator::v1::InitializeModel& m,
                                        absl::Duration budget) {
  absl::StatusOr<tensor::FlatModel> init = trainer_.InitialState(/*include_buffers=*/true);
  absl::Status status = init.status();
  std::shared_ptr<const tensor::FlatModel> model;
  if (status.ok()) {
    model = std::make_shared<const tensor::FlatModel>(*std::move(init));
    const common::v1::ModelMeta meta = tensor::MakeModelMeta(task_, m.version(), *model);
    const std::string address = m.aggregator_address().empty() ? address_ : m.aggregator_address();
    const uint64_t bytes = model->layout.total_bytes();
    status = RetryCall(
                 TransferDeadline(budget, bytes), [this] { return TaskCurrent(); },
                 [&](absl::Time attempt_deadline) {
                   return aggregator_.PutModel(address, meta, tensor::EncodeRaw(model), Me(),
                                               attempt_deadline);
                 },
                 bytes)
                 .status();
  }
  if (!status.ok()) {
    LogError("task ", task_, ": could not upload the initial model: ", status.message());
    deps_.send(MakePeerError(0, status));
    return;
  }
  metrics_.bytes_sent.Increment(static_cast<double>(model->layout.total_bytes()));
  status = trainer_.SetState(*model);
  if (status.ok()) status = Hold(m.version(), *model);
  if (!status.ok()) {
    LogError("task ", task_, ": ", status.message());
    deps_.send(MakePeerError(0, status));
    return;
  }
  snapshots_.Publish(Snapshot{task_, m.version(), model});
  LogInfo(
      absl::StrFormat("task %s: initial model uploaded as version %d (%d parameters, digest %016x)",
                      task_, m.version(), model->values.size(), model->Digest()));
  coordinator::v1::PeerMessage out;
  out.mutable_model_initialized()->set_digest_xxh3(model->Digest());
  deps_.send(out);
}

absl::Status AggregatorPeer::Hold(uint64_t version, const tensor::FlatModel& model) {
  global_version_.reset();
  // A file someone else still reads (an evaluation's HeldOnDisk) keeps what it holds.
  if (global_values_ == nullptr || global_values_.use_count() > 1) {
    SHOAL_ASSIGN_OR_RETURN(tensor::SpillFile file, tensor::SpillFile::Create(deps_.scratch_dir));
    global_values_ = std::make_shared<tensor::SpillFile>(std::move(file));
  }
  SHOAL_RETURN_IF_ERROR(global_values_->Write(model.values));
  global_layout_ = model.layout;
  global_version_ = version;
  params_are_global_ = true;
  return absl::OkStatus();
}

absl::Status AggregatorPeer::LoadGlobal(uint64_t version, absl::Time deadline,
                                        const std::function<bool()>& keep_going) {
  auto read_held = [this](size_t first, absl::Span<float> out) {
    return global_values_->ReadAt(first, out);
  };
  if (global_version_ == version) {
    if (!params_are_global_) {
      SHOAL_RETURN_IF_ERROR(trainer_.SetStateFrom(global_layout_, read_held));
      params_are_global_ = true;
    }
    return absl::OkStatus();
  }
  // The download goes to a new file on disk as it arrives (no model-sized buffer beside
  // LibTorch's parameters and momentum), and into the parameters once it is complete and
  // verified: a failed download leaves both the parameters and the model held as they were.
  // It names the version held, so it may come as the XOR with it (rebuilt and checked against
  // the new version's digests as it arrives); a download that does not check out that way is
  // made again raw.
  SHOAL_ASSIGN_OR_RETURN(tensor::SpillFile file, tensor::SpillFile::Create(deps_.scratch_dir));
  const size_t expected = trainer_.state_layout(/*include_buffers=*/true).total_elements();
  std::optional<aggregator::AggregatorClient::HeldModel> held;
  if (deps_.download_against_held && global_version_.has_value()) {
    held = aggregator::AggregatorClient::HeldModel{*global_version_, read_held};
  }
  size_t attempt = 0;
  const absl::Time start = clock_.Now();
  auto fetch = [&](absl::Time attempt_deadline) {
    if (absl::Status s = file.Reset(expected); !s.ok()) {
      return absl::StatusOr<aggregator::AggregatorClient::ModelDownload>(s);
    }
    return aggregator_.GetModelInto(
        AddressFor(attempt++), task_, version, Me(), attempt_deadline,
        [&](size_t first, absl::Span<const float> values) {
          if (values.size() > expected - std::min(first, expected)) {
            return absl::InvalidArgumentError(absl::StrCat("model version ", version,
                                                           " is larger than this task's model (",
                                                           expected, " values)"));
          }
          return file.WriteAt(first, values);
        },
        held ? &*held : nullptr);
  };
  absl::StatusOr<aggregator::AggregatorClient::ModelDownload> download =
      RetryCall(deadline, keep_going, fetch, expected * sizeof(float));
  if (held && absl::IsInvalidArgument(download.status())) {
    LogWarning("task ", task_, ": model version ", version, " against version ", held->version,
               " did not check out (", download.status().message(), "); downloading it raw");
    held.reset();
    download = RetryCall(deadline, keep_going, fetch, expected * sizeof(float));
  }
  SHOAL_RETURN_IF_ERROR(download.status());
  metrics_.bytes_received.Increment(static_cast<double>(download->payload_bytes));
  LogInfo(absl::StrFormat("task %s: downloaded model version %d, %d bytes, in %.3f s", task_,
                          version, download->payload_bytes,
                          absl::ToDoubleSeconds(clock_.Now() - start)));
  tensor::ModelLayout& layout = download->layout;
  global_version_.reset();
  params_are_global_ = false;
  global_values_ = std::make_shared<tensor::SpillFile>(std::move(file));
  SHOAL_RETURN_IF_ERROR(trainer_.SetStateFrom(layout, read_held));
  global_layout_ = std::move(layout);
  global_version_ = version;
  params_are_global_ = true;
  return absl::OkStatus();
}

std::optional<ModelOnDisk> AggregatorPeer::HeldOnDisk() const {
  if (!global_version_ || global_values_ == nullptr) return std::nullopt;
  return ModelOnDisk{*global_version_, global_layout_, global_values_};
}

std::shared_ptr<const tensor::FlatModel> AggregatorPeer::PublishSnapshot(uint64_t version) {
  if (std::optional<Snapshot> held = snapshots_.Latest(); held && held->version == version) {
    return held->model;
  }
  // What the work before freed (e.g. an evaluation's activations) goes back first, so the copy
  // does not come on top of it.
  ReturnFreeMemory();
  absl::StatusOr<tensor::FlatModel> state = trainer_.GetState(/*include_buffers=*/true);
  if (!state.ok()) {
    LogWarning("task ", task_, ": cannot publish version ", version,
               " as a snapshot: ", state.status().message());
    return nullptr;
  }
  auto model = std::make_shared<const tensor::FlatModel>(*std::move(state));
  snapshots_.Publish(Snapshot{task_, version, model});
  return model;
}

absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> AggregatorPeer::DeltaOf(
    tensor::FlatModel params, uint32_t round_peers) {
  if (!global_version_ || params.layout != global_layout_) {
    return absl::FailedPreconditionError("no global model of this layout is held");
  }
  // Never an update without the privacy the task promises.
  if (!privacy_.ok()) return privacy_.status();
  auto delta = std::make_shared<tensor::FlatModel>(std::move(params));
  SHOAL_RETURN_IF_ERROR(global_values_->SubtractFrom(absl::MakeSpan(delta->values)));
  // Before compression (the aggregator decodes what it receives and, with central noise,
  // clips it again: rounding must not lift an update above the bound).
  privacy_->Apply(absl::MakeSpan(delta->values), round_peers);
  // A test build may tamper with what leaves (a Byzantine peer); what it keeps is its own model.
  deps_.update_hooks.TamperDelta(delta->values);
  return compressor_.Compress(std::move(delta), *global_version_);
}

}  // namespace shoal::peer
