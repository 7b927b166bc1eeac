#pragma once

// An AggregatorClient in memory for peer-side tests (the federated runners, the peer agent):
// keeps models by (address, version), records every peer call with the address it went to,
// answers pushes with the statuses a test scripts, and runs a test's hook after each push with
// no lock of the fake held (e.g. to publish a new version, or to stop the peer). Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "services/aggregator/aggregator_client.h"

namespace shoal::fakes {

class PeerSideAggregator final : public aggregator::AggregatorClient {
 public:
  struct Call {
    std::string method;  // PutModel, PushUpdate, GetModel
    std::string address;
    uint64_t version = 0;  // GetModel, PutModel: the version; PushUpdate: the base version
    absl::Time deadline;   // the attempt's deadline, as the caller set it
  };
  // One push attempt and the fake's answer to it.
  struct Push {
    std::string address;
    aggregator::v1::UpdateMeta meta;
    tensor::FlatModel delta;     // decoded
    uint64_t payload_bytes = 0;  // as sent (compressed or raw)
    absl::Status status;
    absl::Time at;  // on the fake's clock (when one is set)
  };
  // Runs after every push attempt, on the pushing thread, with no lock held.
  using PushHook = std::function<void(const Push& push, size_t index)>;

  // The clock that stamps Push::at (null: absl::InfinitePast()). Must outlive the fake.
  void SetClock(const Clock* clock) {
    absl::MutexLock lock(&mu_);
    clock_ = clock;
  }
  void Store(const std::string& address, uint64_t version, tensor::FlatModel model) {
    absl::MutexLock lock(&mu_);
    models_[{address, version}] = std::move(model);
  }
  // GetModelInto naming a held version answers `status` (e.g. a digest mismatch) instead of
  // the model; a raw one still gets it.
  void RefuseAgainstHeld(absl::Status status) {
    absl::MutexLock lock(&mu_);
    refuse_against_held_ = std::move(status);
  }
  // The held version each GetModelInto named (-1: none), in order.
  std::vector<int64_t> held_asked() const {
    absl::MutexLock lock(&mu_);
    return held_asked_;
  }
  // Answers of the next push attempts, in order (OK accepts); afterwards every push is accepted.
  void ScriptPushes(std::vector<absl::Status> answers) {
    absl::MutexLock lock(&mu_);
    script_.assign(answers.begin(), answers.end());
  }
  void OnPush(PushHook hook) {
    absl::MutexLock lock(&mu_);
    on_push_ = std::move(hook);
  }

  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<Call> calls(const std::string& method) const {
    std::vector<Call> out;
    for (const Call& c : calls()) {
      if (c.method == method) out.push_back(c);
    }
    return out;
  }
  std::vector<Push> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  // Waits (really) until `n` push attempts were answered.
  bool WaitForPushes(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pushes_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Waits (really) until `n` GetModel calls were made.
  bool WaitForGets(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return gets_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  absl::StatusOr<uint64_t> PutModel(const std::string& address, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::EncodedModel> encoded,
                                    const aggregator::Caller&, absl::Time deadline) override {
    absl::StatusOr<tensor::FlatModel> model = tensor::DecodeModel(*encoded);
    if (!model.ok()) return model.status();
    absl::MutexLock lock(&mu_);
    calls_.push_back({"PutModel", address, meta.version(), deadline});
    const uint64_t digest = model->Digest();
    models_[{address, meta.version()}] = *std::move(model);
    return digest;
  }
  absl::StatusOr<bool> PushUpdate(const std::string& address,
                                  const aggregator::v1::UpdateMeta& meta,
                                  std::shared_ptr<const tensor::EncodedModel> delta,
                                  absl::Time deadline) override {
    absl::StatusOr<tensor::FlatModel> decoded = tensor::DecodeModel(*delta);
    if (!decoded.ok()) return decoded.status();
    Push push;
    PushHook hook;
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back({"PushUpdate", address, meta.base_version(), deadline});
      push.address = address;
      push.meta = meta;
      push.delta = *std::move(decoded);
      push.payload_bytes = delta->payload_bytes();
      if (!script_.empty()) {
        push.status = script_.front();
        script_.pop_front();
      }
      push.at = clock_ != nullptr ? clock_->Now() : absl::InfinitePast();
      index = pushes_.size();
      pushes_.push_back(push);
      hook = on_push_;
    }
    if (hook) hook(push, index);
    if (!push.status.ok()) return push.status;
    return false;
  }
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string&,
                                             uint64_t version, const aggregator::Caller&,
                                             absl::Time deadline,
                                             std::vector<float> = {}) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({"GetModel", address, version, deadline});
    ++gets_;
    auto it = models_.find({address, version});
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("no version ", version, " at ", address));
    }
    return it->second;
  }
  absl::StatusOr<ModelDownload> GetModelInto(const std::string& address, const std::string& task,
                                             uint64_t version, const aggregator::Caller& caller,
                                             absl::Time deadline, const tensor::WriteValues& write,
                                             const HeldModel* held) override {
    {
      absl::MutexLock lock(&mu_);
      held_asked_.push_back(held == nullptr ? -1 : static_cast<int64_t>(held->version));
      if (held != nullptr && !refuse_against_held_.ok()) return refuse_against_held_;
    }
    return AggregatorClient::GetModelInto(address, task, version, caller, deadline, write, held);
  }
  absl::StatusOr<bool> PushPartial(const std::string&, const aggregator::v1::PartialMeta&,
                                   absl::string_view, absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  absl::Status SetMembers(const std::string&, const aggregator::v1::SetMembersRequest&,
                          absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  absl::Status OpenRound(const std::string&, const aggregator::v1::OpenRoundRequest&,
                         absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string&, const aggregator::v1::CloseRoundRequest&, absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  absl::StatusOr<std::optional<uint64_t>> ReleaseTask(const std::string&, const std::string&,
                                                      absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  absl::StatusOr<bool> PullModel(const std::string&, const aggregator::v1::PullModelRequest&,
                                 absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }

  absl::Status OpenBuffer(const std::string&, const aggregator::v1::OpenBufferRequest&,
                          absl::Time) override {
    return absl::UnimplementedError("not a peer call");
  }
  std::unique_ptr<aggregator::AggregatorWatch> WatchTask(const std::string&, const std::string&,
                                                         TaskEventFn, WatchDoneFn) override {
    return nullptr;  // not a peer call
  }

 private:
  mutable absl::Mutex mu_;
  const Clock* clock_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::pair<std::string, uint64_t>, tensor::FlatModel> models_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> script_ ABSL_GUARDED_BY(mu_);
  PushHook on_push_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  absl::Status refuse_against_held_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> held_asked_ ABSL_GUARDED_BY(mu_);
  std::vector<Push> pushes_ ABSL_GUARDED_BY(mu_);
  size_t gets_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::fakes
