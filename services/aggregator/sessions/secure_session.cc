#include "services/aggregator/sessions/secure_session.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/aggregation/strategy.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/dp_update.h"
#include "libs/privacy/secagg/graph.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/round.h"
#include "libs/privacy/secagg/update_codec.h"
#include "services/aggregator/round_privacy.h"

namespace shoal::aggregator {
namespace {

namespace secagg = privacy::secagg;

constexpr uint32_t kDefaultStepTimeoutMs = 30000;

absl::Status SettingError(const std::string& label, absl::string_view field,
                          absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": secure_aggregation.", field, " ", what));
}

// What secure aggregation cannot be combined with, naming the conflict.
absl::Status CheckSecureConflicts(const OpenRoundParams& p, const std::string& label) {
  const common::v1::Aggregation strategy = p.aggregation.strategy();
  if (strategy != common::v1::AGGREGATION_UNSPECIFIED && strategy != common::v1::AGGREGATION_MEAN) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": secure aggregation reveals only the sum of the updates, and aggregation ",
        aggregation::StrategyName(strategy), " must see each update; use mean"));
  }
  auto refuse = [&label](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": secure aggregation cannot be combined with ", what));
  };
  if (!p.late_peers.empty()) return refuse("late peers (stragglers)");
  if (!p.expected_children.empty() || !p.child_backups.empty()) {
    return refuse(
        "children's partial sums (expected_children): on a tree each cluster is one secure "
        "round, and the nodes above take its sum in a plain round");
  }
  if (p.parent.address().empty() != p.parent.child().empty()) {
    return refuse("a parent without both its address and this node's child id");
  }
  if (!p.backups.empty()) {
    return refuse(
        "backups: a secure round's primary copies nothing (a masked update is of no use without "
        "its round's unmasking); its backups hold standby rounds (standby_for) that start the "
        "round again when promoted");
  }
  if (p.dp.level() != common::v1::DP_LEVEL_UNSPECIFIED) {
    if (absl::Status s = CheckRoundDp(p, label); !s.ok()) return s;
    if (p.dp.clip_norm() != p.secure_aggregation.clip_norm()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": secure_aggregation.clip_norm ", p.secure_aggregation.clip_norm(),
          " differs from dp.clip_norm ", p.dp.clip_norm(), ": updates are clipped once"));
    }
  }
  if (p.max_update_norm != 0) {
    return refuse(
        "max_update_norm (a masked update's norm cannot be checked; each peer clips its own to "
        "secure_aggregation.clip_norm)");
  }
  return absl::OkStatus();
}

// The noise each peer's update carries per value: its share of distributed noise, else none.
double PeerNoiseStddev(const common::v1::DpSpec& dp, size_t peers) {
  if (dp.level() != common::v1::DP_LEVEL_PEER || dp.noise() != common::v1::DP_NOISE_DISTRIBUTED) {
    return 0;
  }
  return privacy::DistributedNoiseStddev(dp.noise_multiplier(), dp.clip_norm(),
                                         static_cast<uint32_t>(peers));
}

}  // namespace

absl::StatusOr<std::shared_ptr<SecureRoundSession>> SecureRoundSession::Make(
    const OpenRoundParams& p, SessionHost& host) {
  if (p.round == 0) return absl::InvalidArgumentError("round must be >= 1");
  const std::string label = RoundLabel(p.round, p.task);
  if (absl::Status s = CheckSecureConflicts(p, label); !s.ok()) return s;
  const v1::SecureAggregationSettings& settings = p.secure_aggregation;
  const int n = static_cast<int>(p.expected_peers.size());
  if (n < secagg::kMinParticipants) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": secure aggregation needs at least ",
                                                   secagg::kMinParticipants,
                                                   " expected peers, got ", n));
  }
  if (absl::StatusOr<privacy::FixedPointCodec> codec =
          secagg::UpdateCodec(settings.clip_norm(), n, PeerNoiseStddev(p.dp, DpRoundPeers(p)));
      !codec.ok()) {
    return SettingError(label, "clip_norm", codec.status().message());
  }
  for (const std::string& peer : p.expected_peers) {
    auto key = settings.identity_keys().find(peer);
    if (key == settings.identity_keys().end()) {
      return SettingError(label, "identity_keys",
                          absl::StrCat("has no key of expected peer '", EscapeBytes(peer), "'"));
    }
    if (key->second.size() != 32) {
      return SettingError(
          label, "identity_keys",
          absl::StrCat("['", EscapeBytes(peer), "'] must be 32 bytes, got ", key->second.size()));
    }
  }
  if (settings.identity_keys().size() != p.expected_peers.size()) {
    return SettingError(label, "identity_keys", "names peers that are not expected");
  }
  const uint32_t k = settings.neighbourhood_size() == 0
                         ? static_cast<uint32_t>(n - 1)
                         : std::min<uint32_t>(settings.neighbourhood_size(), n - 1);
  // The degrees of the graph do not depend on its seed: any seed tells the default threshold.
  absl::StatusOr<secagg::NeighbourhoodGraph> graph = secagg::NeighbourhoodGraph::Create(
      p.expected_peers, static_cast<int>(k), std::string(privacy::kSharedSeedSize, '\0'));
  if (!graph.ok()) return SettingError(label, "neighbourhood_size", graph.status().message());
  const uint32_t threshold = settings.threshold() != 0
                                 ? settings.threshold()
                                 : std::max<uint32_t>(2, graph->max_degree() / 2 + 1);
  privacy::v1::SecAggConfig check;
  check.set_round_id(label);
  for (const std::string& peer : p.expected_peers) check.add_participant_ids(peer);
  check.set_threshold(threshold);
  check.set_neighbourhood_size(k);
  check.set_graph_seed(std::string(privacy::kSharedSeedSize, '\0'));
  check.set_ring_bits(32);
  check.set_vector_length(1);
  if (absl::StatusOr<secagg::SecAggRound> round = secagg::SecAggRound::Create(check); !round.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": secure_aggregation: ", round.status().message()));
  }
  const uint32_t timeout =
      settings.step_timeout_ms() == 0 ? kDefaultStepTimeoutMs : settings.step_timeout_ms();
  return std::shared_ptr<SecureRoundSession>(
      new SecureRoundSession(host, p, threshold, k, timeout));
}

SecureRoundSession::SecureRoundSession(SessionHost& host, const OpenRoundParams& p,
                                       uint32_t threshold, uint32_t neighbourhood,
                                       uint32_t step_timeout_ms)
    : host_(host),
      task_(p.task),
      number_(p.round),
      base_version_(p.base_version),
      expected_(p.expected_peers),
      clip_norm_(p.secure_aggregation.clip_norm()),
      dp_(p.dp),
      dp_round_peers_(DpRoundPeers(p)),
      parent_(p.parent),
      threshold_(threshold),
      neighbourhood_(neighbourhood),
      step_timeout_(absl::Milliseconds(step_timeout_ms)),
      identity_keys_(p.secure_aggregation.identity_keys().begin(),
                     p.secure_aggregation.identity_keys().end()),
      standby_for_(p.standby_for) {}

bool SecureRoundSession::Promotes(const SecureRoundSession& current) const {
  return current.number_ == number_ && !current.standby_for_.empty() && standby_for_.empty() &&
         current.state_ == State::kOpen;
}

std::string SecureRoundSession::Label() const { return RoundLabel(number_, task_); }

absl::StatusOr<std::shared_ptr<AggregationSession>> SecureRoundSession::Open(
    TaskState& task, const std::shared_ptr<AggregationSession>& current) {
  const std::string label = Label();
  auto* cur = dynamic_cast<SecureRoundSession*>(current.get());
  if (current != nullptr && cur == nullptr) {
    if (absl::Status s = current->CheckReplaceable(task); !s.ok()) return s;
  }
  const bool promoted = cur != nullptr && Promotes(*cur);
  if (cur != nullptr && cur->number_ == number_ &&
      (cur->state_ == State::kOpen || cur->state_ == State::kClosing)) {
    if (cur->base_version_ != base_version_) {
      return absl::FailedPreconditionError(absl::StrCat(
          label, " is open with base version ", cur->base_version_, ", not ", base_version_));
    }
    if (cur->standby_for_.empty() && !standby_for_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " runs here as the primary's, not as a standby"));
    }
    // An idempotent re-open (the running protocol goes on; a standby stays one), unless it
    // promotes the standby: then a fresh round starts below.
    if (!promoted) return current;
  }
  if (cur != nullptr && cur->number_ == number_ && cur->state_ == State::kClosed) {
    return absl::FailedPreconditionError(absl::StrCat(label, " is already closed"));
  }
  if (cur != nullptr && (cur->history_->count(number_) > 0 || number_ < cur->number_)) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, " is older than the current round ", cur->number_));
  }
  if (absl::Status base = CheckBaseIsLatest(task, base_version_); !base.ok()) return base;
  base_ = task.versions.at(base_version_).model;
  const size_t values = base_->layout.total_elements();
  if (values == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": secure aggregation needs a model of at least one value"));
  }
  history_ = cur != nullptr ? cur->history_ : std::make_shared<History>();
  opened_at_ = host_.clock().Now();
  if (!standby_for_.empty()) return shared_from_this();  // a standby: no exchange until promoted
  absl::StatusOr<std::string> seed = privacy::RandomBytes(privacy::kSharedSeedSize);
  if (!seed.ok()) return seed.status();
  privacy::v1::SecAggConfig config;
  config.set_round_id(absl::StrCat(task.name, "/round-", number_, "/base-", base_version_));
  for (const std::string& peer : expected_) config.add_participant_ids(peer);
  config.set_threshold(threshold_);
  config.set_neighbourhood_size(neighbourhood_);
  config.set_graph_seed(*std::move(seed));
  config.set_ring_bits(32);
  config.set_vector_length(values);
  absl::StatusOr<privacy::FixedPointCodec> codec = secagg::UpdateCodec(
      clip_norm_, static_cast<int>(expected_.size()), PeerNoiseStddev(dp_, dp_round_peers_));
  if (!codec.ok()) return codec.status();
  absl::StatusOr<std::unique_ptr<secagg::Ed25519KeyVerifier>> verifier =
      secagg::Ed25519KeyVerifier::Create(identity_keys_);
  if (!verifier.ok()) return verifier.status();
  // The sum of the task's last secure round lends this one its memory.
  std::vector<uint32_t> sum_buffer;
  if (cur != nullptr) sum_buffer = std::move(cur->spare_sum_);
  absl::StatusOr<std::unique_ptr<secagg::SecAggServer>> server =
      secagg::SecAggServer::Create(config, *std::move(verifier), std::move(sum_buffer));
  if (!server.ok()) return server.status();
  v1::SecureAggregationStart start;
  *start.mutable_config() = std::move(config);
  start.set_clip_norm(clip_norm_);
  start.set_base_version(base_version_);
  SessionHost* host = &host_;
  exchange_ = std::make_shared<SecureExchange>(
      label, number_, std::move(start), *std::move(server), step_timeout_,
      [host, task = task_](const v1::PushAccepted& accepted) {
        host->metrics().updates_accepted.Increment();
        v1::TaskEvent event;
        *event.mutable_push_accepted() = accepted;
        host->Notify(task, event);
      });
  codec_ = *std::move(codec);
  if (promoted) {
    host_.metrics().secure_restarts.Increment();
    LogWarning(label, ": this backup takes over the secure round of its lost primary (",
               EscapeBytes(cur->standby_for_),
               ") and starts it again from its first step: fresh keys and masks, nothing of the "
               "primary's run is used");
  }
  return shared_from_this();
}

absl::Status SecureRoundSession::CheckReplaceable(const TaskState& task) const {
  if (state_ == State::kClosing) {
    return absl::AbortedError(
        absl::StrCat(RoundLabel(number_, task.name), " is still closing; retry"));
  }
  return absl::OkStatus();
}

void SecureRoundSession::Abandon() {
  if (state_ != State::kOpen) return;
  state_ = State::kAbandoned;
  if (exchange_ != nullptr)
    exchange_->Fail(absl::AbortedError(absl::StrCat(Label(), " was abandoned")));
}

std::shared_ptr<AggregationSession> SecureRoundSession::OnNewVersion(TaskState&) {
  Abandon();
  return shared_from_this();
}

absl::Status SecureRoundSession::Target(TaskState&, const PushMeta& meta, PushTarget& target) {
  target.reason = RejectReason::kRoundNotOpen;
  return absl::FailedPreconditionError(absl::StrCat(
      Label(),
      " takes updates through secure aggregation (SecureAggregate), not PushUpdate (peer '",
      EscapeBytes(meta.peer_id), "')"));
}

Acceptance SecureRoundSession::Accept(TaskState&, PushedUpdate&) {
  Acceptance out;
  out.status = absl::FailedPreconditionError(
      absl::StrCat(Label(), " takes updates through secure aggregation only"));
  return out;
}

absl::StatusOr<bool> SecureRoundSession::AddPartial(const std::shared_ptr<TaskState>&,
                                                    const PartialMeta& meta,
                                                    const aggregation::PartialSum&) {
  return absl::FailedPreconditionError(
      absl::StrCat(Label(), " has secure aggregation: it takes no partial sum (from '",
                   EscapeBytes(meta.child), "')"));
}

absl::StatusOr<size_t> SecureRoundSession::PartialValues(const TaskState&, uint64_t) const {
  return absl::FailedPreconditionError(
      absl::StrCat(Label(), " has secure aggregation: it takes no partial sum"));
}

void SecureRoundSession::Describe(v1::WatchStarted& started) const {
  if (state_ != State::kOpen || exchange_ == nullptr) return;
  started.set_open_round(number_);
  for (const std::string& peer : exchange_->Accepted()) started.add_accepted(peer);
}

absl::StatusOr<std::shared_ptr<SecureExchange>> SecureRoundSession::Secure(const TaskState& task,
                                                                           uint64_t round) {
  if (round != number_ || (state_ != State::kOpen && state_ != State::kClosing)) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoundLabel(round, task.name), " is not open (secure round ", number_,
                     round == number_ ? " is over)" : " is the current one)"));
  }
  if (exchange_ == nullptr) {  // a standby: the peer tries its primary, or later this one again
    host_.metrics().RejectedCounter(RejectReason::kStandby).Increment();
    return absl::UnavailableError(absl::StrCat(RoundLabel(round, task.name),
                                               ": standby backup (of '", EscapeBytes(standby_for_),
                                               "'), not promoted"));
  }
  return exchange_;
}

// ---------------------------------------------------------------------------------------------
// Closing

v1::ParentRound SecureRoundSession::ParentOf(uint64_t round) const {
  return round == number_ ? parent_ : v1::ParentRound();
}

absl::StatusOr<RoundResult> SecureRoundSession::Close(TaskState& task, uint64_t number) {
  const std::string label = RoundLabel(number, task.name);
  if (!parent_.address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, " closes into its cluster's sum for the parent, not a version"));
  }
  {
    absl::MutexLock lock(&host_.mu());
    if (auto it = history_->find(number); it != history_->end()) return it->second;
    if (number_ != number || state_ == State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (exchange_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " is a standby backup's: no secure round ran here"));
    }
    if (state_ == State::kClosing) {
      host_.mu().Await(absl::Condition(
          +[](SecureRoundSession* s) { return s->state_ != State::kClosing; }, this));
      if (auto it = history_->find(number); it != history_->end()) return it->second;
    }
    if (state_ != State::kOpen && state_ != State::kFailed) {
      return absl::AbortedError(absl::StrCat(label, " was abandoned while closing"));
    }
    if (state_ == State::kOpen) state_ = State::kClosing;
  }
  // Open set exchange_ and codec_ before the round could be closed; neither changes after.
  absl::StatusOr<SecureExchange::Outcome> outcome = exchange_->RunOut();
  // The model is written into the buffer of the version its publishing evicts, as plain rounds
  // do (no fresh pages to fault in).
  std::vector<float> values;
  if (outcome.ok()) {
    absl::MutexLock lock(&host_.mu());
    values = host_.TakeEvictedBuffer(task, base_version_, base_->layout);
  }
  const absl::Status applied =
      outcome.ok()
          ? MeanOf(*outcome, values)
          : absl::Status(outcome.status().code(),
                         absl::StrCat(label, ": secure aggregation failed, nothing is published: ",
                                      outcome.status().message()));
  absl::MutexLock lock(&host_.mu());
  if (!applied.ok()) {
    if (state_ == State::kClosing) state_ = State::kFailed;
    return applied;
  }
  if (state_ != State::kClosing || task.released || task.latest != base_version_) {
    state_ = State::kAbandoned;
    return absl::AbortedError(
        absl::StrCat(TaskLabel(task.name), " changed while round ", number, " was closing"));
  }
  auto next = std::make_shared<tensor::FlatModel>();
  next->layout = base_->layout;
  next->values = std::move(values);
  RoundResult result;
  result.version = base_version_ + 1;
  result.digest = next->Digest();
  result.contributors = outcome->survivors;
  result.num_samples = outcome->num_samples;
  result.mean_train_loss =
      outcome->num_samples > 0 ? outcome->loss_sum / static_cast<double>(outcome->num_samples) : 0;
  result.note = dp_.level() == common::v1::DP_LEVEL_PEER
                    ? absl::StrCat("secure aggregation with differential privacy: ",
                                   outcome->survivors.size(), " of ", expected_.size(),
                                   " peers' clipped updates and the noise, over ", expected_.size())
                    : absl::StrCat("secure aggregation: the mean of ", outcome->survivors.size(),
                                   " of ", expected_.size(), " peers' clipped updates");
  host_.PublishVersion(task, result.version, std::move(next), result.digest);
  result.model_bytes = task.versions.at(result.version).model->layout.total_bytes();
  state_ = State::kClosed;
  spare_sum_ = std::move(*outcome->sum);  // over: no RunOut follows
  (*history_)[number] = result;
  while (history_->size() > static_cast<size_t>(host_.options().closed_rounds_kept)) {
    history_->erase(history_->begin());
  }
  host_.metrics().rounds_completed.Increment();
  host_.metrics().round_duration.Observe(absl::ToDoubleSeconds(host_.clock().Now() - opened_at_));
  return result;
}

absl::Status SecureRoundSession::MeanOf(const SecureExchange::Outcome& outcome,
                                        std::vector<float>& out) const {
  const int survivors = static_cast<int>(outcome.survivors.size());
  if (dp_.level() != common::v1::DP_LEVEL_PEER) {
    return secagg::ApplyMeanOfSumInto(*codec_, *outcome.sum, survivors, base_->values, out);
  }
  absl::StatusOr<std::vector<double>> sum = codec_->DecodeSum(*outcome.sum, survivors);
  if (!sum.ok()) return sum.status();
  absl::StatusOr<std::vector<float>> mean =
      PrivateMeanOfSum(dp_, *sum, outcome.survivors.size(), dp_round_peers_, base_->values);
  if (!mean.ok()) return mean.status();
  out = *std::move(mean);
  return absl::OkStatus();
}

// On a tree: the cluster's secure round closes into the survivors' sum for the parent, each
// update weighing 1 (the parent's plain round divides by every cluster's survivors).
absl::StatusOr<std::shared_ptr<const PartialResult>> SecureRoundSession::ClosePartial(
    TaskState& task, uint64_t number) {
  const std::string label = RoundLabel(number, task.name);
  if (parent_.address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, " has no parent: CloseRound publishes it"));
  }
  {
    absl::MutexLock lock(&host_.mu());
    if (number_ != number || state_ == State::kAbandoned) {
      return absl::NotFoundError(absl::StrCat(label, " is not open"));
    }
    if (exchange_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, " is a standby backup's: no secure round ran here"));
    }
    if (state_ == State::kClosing) {
      host_.mu().Await(absl::Condition(
          +[](SecureRoundSession* s) { return s->state_ != State::kClosing; }, this));
    }
    if (partial_ != nullptr) return partial_;
    if (state_ != State::kOpen && state_ != State::kFailed) {
      return absl::AbortedError(absl::StrCat(label, " was abandoned while closing"));
    }
    if (state_ == State::kOpen) state_ = State::kClosing;
  }
  absl::StatusOr<SecureExchange::Outcome> outcome = exchange_->RunOut();
  absl::StatusOr<std::vector<double>> sum =
      outcome.ok() ? codec_->DecodeSum(*outcome->sum, static_cast<int>(outcome->survivors.size()))
                   : absl::StatusOr<std::vector<double>>(outcome.status());
  absl::MutexLock lock(&host_.mu());
  if (!sum.ok()) {
    if (state_ == State::kClosing) state_ = State::kFailed;
    return absl::Status(sum.status().code(),
                        absl::StrCat(label, ": secure aggregation failed, nothing is forwarded: ",
                                     sum.status().message()));
  }
  if (state_ != State::kClosing) {
    state_ = State::kAbandoned;
    return absl::AbortedError(absl::StrCat(label, " was abandoned while closing"));
  }
  auto result = std::make_shared<PartialResult>();
  result->meta.task = task.name;
  result->meta.round = number;
  result->meta.base_version = base_version_;
  result->meta.contributors = outcome->survivors;
  result->meta.num_samples = outcome->num_samples;
  result->meta.loss_sum = outcome->loss_sum;
  result->sum.summation = aggregation::Summation::kFloat;
  result->sum.sum.assign(sum->begin(), sum->end());
  result->sum.count = outcome->survivors.size();
  result->sum.total_weight = static_cast<double>(outcome->survivors.size());
  partial_ = result;
  state_ = State::kClosed;
  spare_sum_ = std::move(*outcome->sum);  // over: no RunOut follows
  host_.metrics().rounds_completed.Increment();
  host_.metrics().round_duration.Observe(absl::ToDoubleSeconds(host_.clock().Now() - opened_at_));
  return partial_;
}

}  // namespace shoal::aggregator
