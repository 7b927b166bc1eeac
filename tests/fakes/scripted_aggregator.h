#pragma once

// A scripted AggregatorClient for coordinator tests (tests/unit) and the coordinator fuzz target:
// records every call, answers with the statuses and contributors the test sets, and lets the
// test play the aggregator's watch stream (Accept, BreakWatches). Thread-safe; callbacks run
// with no lock of the fake held.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "services/aggregator/aggregator_client.h"

namespace shoal::fakes {

class ScriptedAggregator final : public aggregator::AggregatorClient {
 public:
  absl::Status OpenRound(const std::string& address,
                         const aggregator::v1::OpenRoundRequest& request, absl::Time) override {
    absl::MutexLock lock(&mu_);
    opened.push_back(request);
    open_addresses.push_back(address);
    if (open_fails_at.count(address) > 0) return absl::UnavailableError("scripted: down");
    return open_status;
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string& address, const aggregator::v1::CloseRoundRequest& request,
      absl::Time) override {
    absl::MutexLock lock(&mu_);
    closed.push_back(request);
    close_addresses.push_back(address);
    if (!close_status.ok()) return close_status;
    aggregator::v1::CloseRoundResponse response;
    if (!contributors.empty()) ++version;
    response.set_version(version);
    response.set_digest_xxh3(ModelOf(version).Digest());
    for (const auto& c : contributors) response.add_contributors(c);
    response.set_num_samples(100 * contributors.size());
    response.set_mean_train_loss(0.5);
    response.set_model_bytes(model_bytes);
    return response;
  }
  absl::Status OpenBuffer(const std::string& address,
                          const aggregator::v1::OpenBufferRequest& request, absl::Time) override {
    absl::MutexLock lock(&mu_);
    buffers.push_back(request);
    buffer_addresses.push_back(address);
    return open_status;
  }
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string&,
                                             uint64_t v, const aggregator::Caller&, absl::Time,
                                             std::vector<float> = {}) override {
    absl::MutexLock lock(&mu_);
    gets.emplace_back(address, v);
    if (get_fails_at.count(address) > 0) return absl::NotFoundError("scripted: no such version");
    return ModelOf(other_models ? v + 1000 : v);
  }
  // The model this fake publishes as `version` (CloseRound's digest is of it).
  static tensor::FlatModel ModelOf(uint64_t version) {
    tensor::FlatModel model;
    model.layout = *tensor::ModelLayout::Create({{"w", {2}}});
    model.values = {static_cast<float>(version), 1.0f};
    return model;
  }
  absl::StatusOr<uint64_t> PutModel(const std::string& address, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::EncodedModel> encoded,
                                    const aggregator::Caller&, absl::Time) override {
    absl::StatusOr<tensor::FlatModel> model = tensor::DecodeModel(*encoded);
    if (!model.ok()) return model.status();
    absl::MutexLock lock(&mu_);
    if (!put_status.ok()) return put_status;
    puts.push_back({meta.task(), meta.version()});
    put_addresses.push_back(address);
    version = meta.version();
    return model->Digest();
  }
  absl::StatusOr<bool> PushUpdate(const std::string&, const aggregator::v1::UpdateMeta&,
                                  std::shared_ptr<const tensor::EncodedModel>,
                                  absl::Time) override {
    return absl::UnimplementedError("the coordinator never pushes");
  }
  absl::StatusOr<bool> PushPartial(const std::string&, const aggregator::v1::PartialMeta&,
                                   absl::string_view, absl::Time) override {
    return absl::UnimplementedError("the coordinator never pushes partial sums");
  }
  absl::Status SetMembers(const std::string& address,
                          const aggregator::v1::SetMembersRequest& request, absl::Time) override {
    absl::MutexLock lock(&mu_);
    members.push_back(request);
    member_addresses.push_back(address);
    return absl::OkStatus();
  }
  // Says it held `version`, the newest it made or was given (of whichever task).
  absl::StatusOr<std::optional<uint64_t>> ReleaseTask(const std::string& address,
                                                      const std::string& task,
                                                      absl::Time) override {
    absl::MutexLock lock(&mu_);
    released.push_back(task);
    released_addresses.push_back(address);
    return std::optional<uint64_t>(version);
  }
  absl::StatusOr<bool> PullModel(const std::string& address,
                                 const aggregator::v1::PullModelRequest& request,
                                 absl::Time) override {
    absl::MutexLock lock(&mu_);
    pulls.emplace_back(address, request);
    return true;
  }

  std::unique_ptr<aggregator::AggregatorWatch> WatchTask(const std::string& address,
                                                         const std::string& task,
                                                         TaskEventFn on_event,
                                                         WatchDoneFn on_done) override {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_watch_++;
      watches_[id] = Watch{address, task, on_event, on_done};
    }
    aggregator::v1::TaskEvent started;
    started.mutable_started();
    on_event(started);
    return std::make_unique<Handle>(this, id);
  }

  // The aggregator at any address accepted `peer`'s update for `round` of `task`: every live
  // watch of the task gets a PushAccepted.
  void Accept(const std::string& task, uint64_t round, const std::string& peer,
              int64_t train_ms = 0, uint64_t update_bytes = 0) {
    aggregator::v1::TaskEvent event;
    event.mutable_push_accepted()->set_round(round);
    event.mutable_push_accepted()->set_peer_id(peer);
    event.mutable_push_accepted()->set_num_samples(100);
    event.mutable_push_accepted()->set_train_ms(train_ms);
    event.mutable_push_accepted()->set_update_bytes(update_bytes);
    for (const auto& w : WatchesOf([&](const Watch& x) { return x.task == task; })) {
      w.on_event(event);
    }
  }
  // The aggregator published `version` of `task` from its buffer (federated-async).
  void Publish(const std::string& task, uint64_t version, std::vector<std::string> from) {
    aggregator::v1::TaskEvent event;
    auto& v = *event.mutable_version_published();
    v.set_version(version);
    for (const auto& peer : from) v.add_contributors(peer);
    v.set_num_samples(100 * from.size());
    v.set_mean_train_loss(0.5);
    v.set_mean_staleness(0.5);
    for (const auto& w : WatchesOf([&](const Watch& x) { return x.task == task; })) {
      w.on_event(event);
    }
  }
  // The aggregator at `address` is gone: its watch streams end with `status`.
  void BreakWatches(const std::string& address, absl::Status status) {
    std::vector<Watch> broken;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = watches_.begin(); it != watches_.end();) {
        if (it->second.address == address) {
          broken.push_back(it->second);
          it = watches_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& w : broken) w.on_done(status);
  }
  // Live watches of `task` (at `address`, when given).
  size_t watch_count(const std::string& task, const std::string& address = "") {
    return WatchesOf([&](const Watch& w) {
             return w.task == task && (address.empty() || w.address == address);
           })
        .size();
  }

  // Set by the test.
  absl::Status open_status;
  std::set<std::string> open_fails_at;  // OpenRound at these answers UNAVAILABLE
  absl::Status close_status;
  absl::Status put_status;
  std::set<std::string> get_fails_at;  // GetModel at these answers NOT_FOUND
  bool other_models = false;           // GetModel answers with models other than those published
  std::vector<std::string> contributors;
  uint64_t model_bytes = 0;  // CloseRoundResponse.model_bytes
  uint64_t version = 0;
  // Recorded.
  std::vector<aggregator::v1::OpenRoundRequest> opened;
  std::vector<std::string> open_addresses;
  std::vector<aggregator::v1::CloseRoundRequest> closed;
  std::vector<std::string> close_addresses;
  std::vector<std::pair<std::string, aggregator::v1::PullModelRequest>> pulls;
  std::vector<aggregator::v1::OpenBufferRequest> buffers;
  std::vector<std::string> buffer_addresses;
  std::vector<std::pair<std::string, uint64_t>> gets;  // {address, version}
  std::vector<std::pair<std::string, uint64_t>> puts;
  std::vector<std::string> put_addresses;
  std::vector<std::string> released;
  std::vector<std::string> released_addresses;  // where each of `released` was released
  std::vector<aggregator::v1::SetMembersRequest> members;
  std::vector<std::string> member_addresses;

 private:
  struct Watch {
    std::string address;
    std::string task;
    TaskEventFn on_event;
    WatchDoneFn on_done;
  };
  class Handle final : public aggregator::AggregatorWatch {
   public:
    Handle(ScriptedAggregator* fake, uint64_t id) : fake_(fake), id_(id) {}
    ~Handle() override {
      std::optional<Watch> w;
      {
        absl::MutexLock lock(&fake_->mu_);
        auto it = fake_->watches_.find(id_);
        if (it == fake_->watches_.end()) return;  // already broken
        w = std::move(it->second);
        fake_->watches_.erase(it);
      }
      w->on_done(absl::CancelledError("watch cancelled"));
    }

   private:
    ScriptedAggregator* const fake_;
    const uint64_t id_;
  };

  std::vector<Watch> WatchesOf(const std::function<bool(const Watch&)>& match) {
    absl::MutexLock lock(&mu_);
    std::vector<Watch> out;
    for (const auto& [id, w] : watches_) {
      if (match(w)) out.push_back(w);
    }
    return out;
  }

  absl::Mutex mu_;
  std::map<uint64_t, Watch> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shoal::fakes
