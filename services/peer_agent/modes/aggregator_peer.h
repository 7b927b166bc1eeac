#pragma once

// What the peer runners of the aggregator-backed modes (federated-sync, federated-async) share:
// the task's aggregator and its address, the caller identity its calls carry, retries, the
// upload of the initial model and the global model held exactly. The counterpart of the
// coordinator's AggregatorModeTask.
//
// The global model held is kept on disk (a tensor::SpillFile in ModeRunnerDeps::scratch_dir), not
// in memory: while the peer trains, LibTorch already holds three models' worth (parameters,
// gradients, momentum), and the global model is needed again only for the delta after training
// and to start a round again from it.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "libs/common/backoff.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/spill_file.h"
#include "libs/training/trainer.h"
#include "services/aggregator/aggregator_client.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "services/peer_agent/update_compression.h"
#include "services/peer_agent/update_privacy.h"

namespace shoal::peer {

// How the calls to the aggregator are retried (rpc::Retry): on UNAVAILABLE and
// RESOURCE_EXHAUSTED, and when an attempt ran out of its own bound while the call's deadline has
// room for another; each attempt bounded by `rpc_timeout`, and one that moves a model or an
// update by `rpc_timeout` plus its bytes at `slowest_link` (TransferTimeout).
struct AggregatorCallOptions {
  absl::Duration rpc_timeout = absl::Seconds(30);
  BackoffOptions retry_backoff{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.2};
  // Bytes per second of the slowest link a peer may sit behind: 1 Mbit/s. A 100 MB model takes
  // 40 s over a 20 Mbit/s home uplink and 160 s over 5 Mbit/s, far beyond `rpc_timeout`.
  double slowest_link = rpc::kSlowestLink;
};

// A version of the global model as a peer holds it on disk (AggregatorPeer::HeldOnDisk): the
// file stays readable through `values` (from any thread: reads only) after the peer has moved on
// to another version, and goes when the last holder lets go of it.
struct ModelOnDisk {
  uint64_t version = 0;
  tensor::ModelLayout layout;
  std::shared_ptr<const tensor::SpillFile> values;
};

// Owned by a runner and used on its worker thread only; `deps` must hold an aggregator (the
// runners' factories check it with CheckRunnerDeps). Not thread-safe.
class AggregatorPeer {
 public:
  AggregatorPeer(const ModeRunnerDeps& deps, AggregatorCallOptions options);

  const std::string& task() const { return task_; }
  // The aggregator of the latest TaskAssigned (or the first of RoundStarted.aggregators).
  const std::string& address() const { return address_; }
  // A TaskAssigned of the task again (a reconnect, or the task moved because its aggregator
  // died): logs it and takes the address (and forgets any backups). True when the aggregator
  // changed.
  bool Reassign(const std::string& address);
  // Replicas: RoundStarted.aggregators, the cluster's primary first, then its backups. Empty:
  // nothing changes.
  void UseAggregators(const google::protobuf::RepeatedPtrField<std::string>& aggregators);
  // Where attempt `attempt` (0, 1, ...) of a call goes: the aggregator, or with backups each in
  // turn (an attempt is retried when the one before was unavailable).
  const std::string& AddressFor(size_t attempt) const;
  // How many aggregators AddressFor takes turns at: the aggregator and its backups.
  size_t aggregator_count() const { return backups_.size() + 1; }
  // This peer as the aggregator knows it: its id and the current session's token.
  aggregator::Caller Me() const;
  // False once the task is over for this peer (ModeRunnerDeps::task_current).
  bool TaskCurrent() const;

  // rpc::Retry with the runner's clock and these options, until `deadline`, sleeping on the
  // wakeup while `keep_going`. A call that moves `bytes` (a model, an update) passes them: its
  // attempts are bounded by TransferTimeout(bytes) instead of rpc_timeout.
  template <typename Attempt>
  auto RetryCall(absl::Time deadline, const std::function<bool()>& keep_going, Attempt&& attempt,
                 uint64_t bytes = 0) const {
    rpc::RetryOptions retry;
    retry.backoff = options_.retry_backoff;
    retry.attempt_timeout = TransferTimeout(bytes);
    return rpc::Retry(clock_, retry, deadline, wakeup_.Sleeper(keep_going),
                      std::forward<Attempt>(attempt));
  }
  // The bound of one attempt that moves `bytes`: rpc_timeout plus the bytes at slowest_link.
  absl::Duration TransferTimeout(uint64_t bytes) const;
  // The deadline of a transfer of `bytes` that has no round deadline: `budget` from now, or one
  // TransferTimeout(bytes) if that is longer.
  absl::Time TransferDeadline(absl::Duration budget, uint64_t bytes) const {
    return clock_.Now() + std::max(budget, TransferTimeout(bytes));
  }
  // The bytes of the task's model as float32 (what a download or the initial upload moves).
  uint64_t ModelBytes() const {
    return trainer_.state_layout(/*include_buffers=*/true).total_bytes();
  }

  // InitializeModel: uploads the seed's initial model as version 0 (PutModel, retried for
  // TransferDeadline(budget, the model's bytes) while the task is current), holds it as the global
  // model, publishes it as snapshot 0 and answers ModelInitialized with its digest; on failure logs
  // and answers PeerError{round 0}. It goes to `m.aggregator_address` when set (a hierarchical
  // task's root), else to the task's aggregator.
  void UploadInitialModel(const coordinator::v1::InitializeModel& m, absl::Duration budget);
  // Makes the trainer hold global model `version` exactly: a download (GetModel, streamed to
  // disk) unless it is the one held, then read from disk into the parameters if the trainer
  // trained since.
  absl::Status LoadGlobal(uint64_t version, absl::Time deadline,
                          const std::function<bool()>& keep_going);
  // Publishes the trainer's state as snapshot `version` (a copy) unless that version is the
  // snapshot published already, and returns the snapshot's model; null when the state could not
  // be read (logged).
  std::shared_ptr<const tensor::FlatModel> PublishSnapshot(uint64_t version);
  // The global model held, on disk; nullopt when none is.
  std::optional<ModelOnDisk> HeldOnDisk() const;
  // The trainer trained on: its parameters are no longer the global model held.
  void Trained() { params_are_global_ = false; }
  // Forgets the model held (its version numbers belong to another aggregator now).
  void Forget() { global_version_.reset(); }
  const std::optional<uint64_t>& global_version() const { return global_version_; }
  // The update to push: the trainer's parameters `params` minus the global model held, computed
  // in place, clipped (and with distributed noise noised, `round_peers` being the round's
  // expected peers) for differential privacy when the task has it (UpdatePrivacy), through the
  // update hooks (ModeRunnerDeps::update_hooks; empty in shoal-peer), then compressed as the task
  // says (TaskSpec.compression; top-k adds what earlier updates left out). Errors: from reading the
  // global model back from disk.
  absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> DeltaOf(tensor::FlatModel params,
                                                                      uint32_t round_peers = 0);
  // The noise per value DeltaOf adds for `round_peers` (UpdatePrivacy::NoiseStddev; 0 without
  // distributed noise).
  double UpdateNoiseStddev(uint32_t round_peers) const {
    return privacy_.ok() ? privacy_->NoiseStddev(round_peers) : 0;
  }

 private:
  const ModeRunnerDeps& deps_;
  const AggregatorCallOptions options_;
  const std::string task_;
  std::vector<std::string> backups_;  // replicas: after address_, in order
  training::Trainer& trainer_;
  SnapshotStore& snapshots_;
  aggregator::AggregatorClient& aggregator_;
  PeerMetrics& metrics_;
  const Clock& clock_;
  rpc::Wakeup& wakeup_;

  // Keeps `model` (the trainer's parameters now) as the global model of `version`.
  absl::Status Hold(uint64_t version, const tensor::FlatModel& model);

  tensor::Compressor compressor_;
  // privacy.dp (UpdatePrivacy); an error only when the CSPRNG could not seed its noise, and
  // DeltaOf then refuses to make an update.
  absl::StatusOr<UpdatePrivacy> privacy_;
  std::string address_;
  std::optional<uint64_t> global_version_;
  tensor::ModelLayout global_layout_;
  // Created at the first Hold(), replaced by each download; shared with HeldOnDisk's holders,
  // so written only while this class is its one holder.
  std::shared_ptr<tensor::SpillFile> global_values_;
  bool params_are_global_ = false;  // the trainer's parameters equal global_ (not trained since)
};

}  // namespace shoal::peer
