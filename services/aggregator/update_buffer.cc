#include "services/aggregator/update_buffer.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/async_spec.h"
#include "libs/common/escape.h"

namespace shoal::aggregator {

using google::protobuf::util::MessageDifferencer;

absl::StatusOr<std::unique_ptr<UpdateBuffer>> UpdateBuffer::Create(std::string task,
                                                                   BufferSettings settings,
                                                                   uint64_t opened_on,
                                                                   int threads) {
  // Without it the default (min_participants) is the coordinator's to know.
  if (!settings.async.has_buffer_size()) {
    return absl::InvalidArgumentError("async.buffer_size: required (>= 1)");
  }
  if (absl::Status valid = aggregation::ValidateAsyncSpec(settings.async, 0, "async");
      !valid.ok()) {
    return valid;
  }
  aggregation::ApplyAsyncDefaults(settings.async, settings.async.buffer_size());
  if (!(settings.max_update_norm >= 0) || !std::isfinite(settings.max_update_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_update_norm: must be finite and >= 0, got ", settings.max_update_norm));
  }
  absl::StatusOr<aggregation::Strategy> strategy = StrategyFor(settings.aggregation, threads);
  if (!strategy.ok()) return strategy.status();
  return std::unique_ptr<UpdateBuffer>(new UpdateBuffer(std::move(task), std::move(settings),
                                                        *std::move(strategy), opened_on, threads));
}

UpdateBuffer::UpdateBuffer(std::string task, BufferSettings settings,
                           aggregation::Strategy strategy, uint64_t opened_on, int threads)
    : task_(std::move(task)),
      settings_(std::move(settings)),
      strategy_(std::move(strategy)),
      opened_on_(opened_on),
      threads_(threads) {}

std::unique_ptr<UpdateBuffer> UpdateBuffer::Reopen(uint64_t version) const {
  return std::unique_ptr<UpdateBuffer>(
      new UpdateBuffer(task_, settings_, strategy_, version, threads_));
}

bool UpdateBuffer::SameSettings(const UpdateBuffer& other) const {
  common::v1::AsyncSpec mine = settings_.async;
  mine.set_buffer_size(other.settings_.async.buffer_size());
  return MessageDifferencer::Equals(mine, other.settings_.async) &&
         MessageDifferencer::Equals(settings_.parent, other.settings_.parent) &&
         strategy_.kind() == other.strategy_.kind() &&
         MessageDifferencer::Equals(strategy_.params(), other.strategy_.params()) &&
         settings_.max_update_norm == other.settings_.max_update_norm &&
         settings_.last_version == other.settings_.last_version;
}

void UpdateBuffer::Adjust(const UpdateBuffer& other) {
  settings_.async.set_buffer_size(other.settings_.async.buffer_size());
  settings_.children = other.settings_.children;
}

bool UpdateBuffer::Finished(uint64_t latest) const {
  return settings_.last_version != 0 && latest >= settings_.last_version;
}

UpdateBuffer::Admission UpdateBuffer::Admit(const std::string& peer, uint64_t base_version,
                                            uint64_t latest) const {
  const std::string task = absl::StrCat("task '", EscapeBytes(task_), "'");
  auto refuse = [](RejectReason reason, absl::Status status) {
    Admission admission;
    admission.refusal = PushRefusal{reason, std::move(status)};
    return admission;
  };
  const uint64_t last = settings_.last_version;
  if (Finished(latest)) {
    return refuse(RejectReason::kRoundNotOpen,
                  absl::FailedPreconditionError(absl::StrCat(task, " published its last version ",
                                                             last, "; its buffer is closed")));
  }
  if (last != 0 && latest + 1 >= last && !pass_peers_.empty() && !settings_.forwards()) {
    // The running pass publishes the last version: nothing accepted now would be aggregated.
    return refuse(RejectReason::kRoundNotOpen,
                  absl::FailedPreconditionError(absl::StrCat(
                      task, " is aggregating its last version ", last, "; its buffer is closed")));
  }
  if (base_version > latest) {
    return refuse(RejectReason::kStaleBase, absl::FailedPreconditionError(absl::StrCat(
                                                "update was trained from version ", base_version,
                                                ", but ", task, " is at version ", latest)));
  }
  const uint64_t staleness = latest - base_version;
  if (staleness > settings_.async.max_staleness()) {
    return refuse(
        RejectReason::kStale,
        absl::FailedPreconditionError(absl::StrCat(
            "update was trained from version ", base_version, ", ", staleness,
            " versions behind version ", latest, " of ", task, ", over its async.max_staleness ",
            settings_.async.max_staleness(), ": fetch the latest model")));
  }
  if (updates_.count(peer) == 0 && updates_.size() + pass_held_ >= capacity()) {
    return refuse(RejectReason::kBusy,
                  absl::ResourceExhaustedError(absl::StrCat("the buffer of ", task, " is full (",
                                                            capacity(), " updates) until version ",
                                                            latest + 1, " is aggregated; retry")));
  }
  Admission admission;
  admission.staleness = staleness;
  return admission;
}

UpdateBuffer::Fingerprint UpdateBuffer::FingerprintOf(const Update& update) {
  return Fingerprint{update.base_version, update.num_samples, update.train_loss,
                     update.sum_squares};
}

bool UpdateBuffer::Repeats(const Update& update) const {
  const Fingerprint fingerprint = FingerprintOf(update);
  auto last = last_pass_.find(update.peer);
  if (last != last_pass_.end() && last->second == fingerprint) return true;
  auto held = updates_.find(update.peer);
  if (held != updates_.end() && FingerprintOf(held->second) == fingerprint) return true;
  auto [from, to] = merged_.equal_range(update.peer);
  for (auto it = from; it != to; ++it) {
    if (it->second == fingerprint) return true;
  }
  return false;
}

bool UpdateBuffer::Merge(const Update& update) {
  auto held = updates_.find(update.peer);
  if (update.contributors.empty() || held == updates_.end()) return false;
  Update& into = held->second;
  if (merged_.count(update.peer) == 0) merged_.emplace(update.peer, FingerprintOf(into));
  const double n_old = static_cast<double>(into.num_samples);
  const double n_new = static_cast<double>(update.num_samples);
  const double n = n_old + n_new;
  const float a =
      static_cast<float>(n_old * aggregation::StalenessFactor(settings_.async, into.staleness) / n);
  const float b = static_cast<float>(
      n_new * aggregation::StalenessFactor(settings_.async, update.staleness) / n);
  for (size_t i = 0; i < into.delta.size(); ++i) {
    into.delta[i] = a * into.delta[i] + b * update.delta[i];
  }
  merged_.emplace(update.peer, FingerprintOf(update));
  filled_ += Weight(update);
  into.staleness = 0;  // weighted in already
  into.merged = true;
  into.num_samples += update.num_samples;
  into.train_loss = (n_old * into.train_loss + n_new * update.train_loss) / n;
  into.contributors.insert(into.contributors.end(), update.contributors.begin(),
                           update.contributors.end());
  return true;
}

std::optional<UpdateBuffer::Update> UpdateBuffer::Put(Update update) {
  auto held = updates_.find(update.peer);
  filled_ += Weight(update);
  if (held == updates_.end()) {
    std::string peer = update.peer;
    updates_.emplace(std::move(peer), std::move(update));
    return std::nullopt;
  }
  filled_ -= Weight(held->second);
  std::optional<Update> replaced = std::move(held->second);
  held->second = std::move(update);
  return replaced;
}

std::vector<std::string> UpdateBuffer::Pending() const {
  std::set<std::string> peers = pass_peers_;
  for (const auto& [peer, update] : updates_) peers.insert(peer);
  return {peers.begin(), peers.end()};
}

bool UpdateBuffer::ClaimPass() {
  if (pass_running_ || filled_ < capacity()) return false;
  pass_running_ = true;
  return true;
}

std::optional<std::vector<UpdateBuffer::Update>> UpdateBuffer::TakeFullPass() {
  if (filled_ < capacity()) {
    pass_running_ = false;
    return std::nullopt;
  }
  std::vector<Update> pass;
  pass.reserve(updates_.size());
  last_pass_.clear();
  merged_.clear();
  for (auto& [peer, update] : updates_) {  // in peer order
    last_pass_[peer] = FingerprintOf(update);
    pass_peers_.insert(peer);
    pass.push_back(std::move(update));
  }
  updates_.clear();
  filled_ = 0;
  pass_held_ = pass.size();
  return pass;
}

void UpdateBuffer::Folded() {
  if (pass_held_ > 0) --pass_held_;
}

void UpdateBuffer::PassDone() {
  pass_held_ = 0;
  pass_peers_.clear();
}

std::unique_ptr<RoundAggregation> UpdateBuffer::TakeAggregation(const tensor::ModelLayout& layout) {
  if (aggregation_ != nullptr && aggregation_->Fits(strategy_, layout)) {
    aggregation_->Reset();
    return std::move(aggregation_);
  }
  aggregation_.reset();
  return std::make_unique<RoundAggregation>(strategy_, layout, capacity(), threads_);
}

void UpdateBuffer::KeepAggregation(std::unique_ptr<RoundAggregation> aggregation) {
  // Only a running sum is worth keeping: the other strategies' copies of K updates would stay
  // allocated between passes, beside the next K buffered updates.
  if (aggregation != nullptr && aggregation->streaming()) aggregation_ = std::move(aggregation);
}

absl::StatusOr<UpdateBuffer::PassResult> UpdateBuffer::RunPass(
    std::vector<Update>& updates, RoundAggregation& aggregation, const common::v1::AsyncSpec& async,
    const tensor::FlatModel& base, std::vector<float>& out,
    const std::function<void(Update&)>& folded) {
  PassResult result;
  double loss_sum = 0;
  double staleness_sum = 0;
  for (Update& update : updates) {
    const double factor = aggregation::StalenessFactor(async, update.staleness);
    const double samples = static_cast<double>(update.num_samples);
    if (factor < 1) {
      const float f = static_cast<float>(factor);
      for (float& v : update.delta) v *= f;
    }
    absl::Status added = aggregation.Add(update.delta, samples, update.peer);
    if (!added.ok()) return added;
    if (update.contributors.empty()) {
      result.contributors.push_back(update.peer);
    } else {
      result.contributors.insert(result.contributors.end(), update.contributors.begin(),
                                 update.contributors.end());
    }
    result.num_samples += update.num_samples;
    loss_sum += update.train_loss * samples;
    staleness_sum += static_cast<double>(update.staleness);
    folded(update);
  }
  absl::StatusOr<aggregation::AggregationReport> report = aggregation.ApplyInto(base, out);
  if (!report.ok()) return report.status();
  result.report = *std::move(report);
  std::sort(result.contributors.begin(), result.contributors.end());
  result.contributors.erase(std::unique(result.contributors.begin(), result.contributors.end()),
                            result.contributors.end());
  if (result.num_samples > 0) {
    result.mean_train_loss = loss_sum / static_cast<double>(result.num_samples);
  }
  if (!updates.empty()) result.mean_staleness = staleness_sum / static_cast<double>(updates.size());
  return result;
}

}  // namespace shoal::aggregator
