#pragma once

// AggregatorClient over real AggregatorCores in this process, one per address: every call goes
// to the same domain code shoal-aggregator runs (validation, strategies, buffers, watches), with
// no gRPC, no sockets and no threads of its own. For tests that run whole rounds in memory.
// Thread-safe.

#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "libs/common/clock.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/partial_wire.h"

namespace shoal::fakes {

class InMemoryAggregator final : public aggregator::AggregatorClient {
 public:
  explicit InMemoryAggregator(const Clock& clock) : clock_(clock) {}

  // The core behind `address` (made on first use).
  aggregator::AggregatorCore& core(const std::string& address) { return *Get(address).core; }

  absl::StatusOr<uint64_t> PutModel(const std::string& address, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::EncodedModel> encoded,
                                    const aggregator::Caller& caller, absl::Time) override {
    aggregator::AggregatorCore& c = core(address);
    absl::Status allowed = c.CheckCaller(meta.task(), caller.peer_id, caller.session_token, "");
    if (!allowed.ok()) return allowed;
    absl::StatusOr<tensor::FlatModel> model = tensor::DecodeModel(*encoded);
    if (!model.ok()) return model.status();
    absl::StatusOr<aggregator::PutResult> put =
        c.PutModel(meta.task(), meta.version(), *std::move(model));
    if (!put.ok()) return put.status();
    return put->digest;
  }

  absl::StatusOr<bool> PushUpdate(const std::string& address,
                                  const aggregator::v1::UpdateMeta& meta,
                                  std::shared_ptr<const tensor::EncodedModel> delta,
                                  absl::Time) override {
    auto push = core(address).BeginPush(aggregator::PushMeta::From(meta, ""));
    if (!push.ok()) return push.status();
    if (*push == nullptr) return true;  // a duplicate of an accepted push
    // The same frames a stream would carry, checked the same way.
    tensor::FrameEncoder encoder(*delta, tensor::kDefaultChunkBytes);
    common::v1::TensorFrame frame;
    while (encoder.Next(&frame)) {
      if (absl::Status s = (*push)->AddFrame(frame); !s.ok()) return s;
    }
    if (absl::Status s = (*push)->Commit(); !s.ok()) return s;
    return (*push)->duplicate();
  }

  absl::StatusOr<bool> PushPartial(const std::string& address,
                                   const aggregator::v1::PartialMeta& meta, absl::string_view bytes,
                                   absl::Time) override {
    aggregator::AggregatorCore& c = core(address);
    absl::StatusOr<size_t> values = c.PartialValues(meta.task(), meta.round());
    if (!values.ok()) return values.status();
    auto receiver = aggregator::PartialReceiver::Start(meta, *values);
    if (!receiver.ok()) return receiver.status();
    if (absl::Status s = receiver->Add(bytes); !s.ok()) return s;
    absl::StatusOr<aggregator::PartialResult> partial = std::move(*receiver).Finish();
    if (!partial.ok()) return partial.status();
    return c.AddPartial(partial->meta, partial->sum);
  }

  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string& task,
                                             uint64_t version, const aggregator::Caller& caller,
                                             absl::Time, std::vector<float> = {}) override {
    aggregator::AggregatorCore& c = core(address);
    absl::Status allowed = c.CheckCaller(task, caller.peer_id, caller.session_token, "");
    if (!allowed.ok()) return allowed;
    auto snapshot = c.GetModel(task, version);
    if (!snapshot.ok()) return snapshot.status();
    return *snapshot->model;
  }

  absl::Status SetMembers(const std::string& address,
                          const aggregator::v1::SetMembersRequest& request, absl::Time) override {
    core(address).SetMembers(request.task(),
                             {request.session_tokens().begin(), request.session_tokens().end()});
    return absl::OkStatus();
  }
  absl::Status OpenRound(const std::string& address,
                         const aggregator::v1::OpenRoundRequest& request, absl::Time) override {
    return core(address).OpenRound(aggregator::OpenRoundParams::From(request));
  }
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string& address, const aggregator::v1::CloseRoundRequest& request,
      absl::Time) override {
    auto result = core(address).CloseRound(request.task(), request.round());
    if (!result.ok()) return result.status();
    return result->ToProto();
  }
  absl::Status OpenBuffer(const std::string& address,
                          const aggregator::v1::OpenBufferRequest& request, absl::Time) override {
    return core(address).OpenBuffer(aggregator::OpenBufferParams::From(request));
  }
  absl::StatusOr<std::optional<uint64_t>> ReleaseTask(const std::string& address,
                                                      const std::string& task,
                                                      absl::Time) override {
    return core(address).ReleaseTask(task);
  }
  absl::StatusOr<bool> PullModel(const std::string&, const aggregator::v1::PullModelRequest&,
                                 absl::Time) override {
    return absl::UnimplementedError("the in-memory aggregators run no trees");
  }

  std::unique_ptr<aggregator::AggregatorWatch> WatchTask(const std::string& address,
                                                         const std::string& task,
                                                         TaskEventFn on_event,
                                                         WatchDoneFn on_done) override {
    aggregator::AggregatorCore& c = core(address);
    const uint64_t handle = c.Watch(task, std::move(on_event));
    return std::make_unique<Watch>(c, handle, std::move(on_done));
  }

 private:
  struct Instance {
    explicit Instance(const Clock& clock)
        : metrics(registry), core(*aggregator::AggregatorCore::Create(Options(), clock, metrics)) {}
    // Every push gets a staging buffer at once: a push refused as busy would wait for a backoff
    // that a test clock which never moves never ends.
    static aggregator::AggregatorCoreOptions Options() {
      aggregator::AggregatorCoreOptions options;
      options.max_concurrent_pushes = 64;
      return options;
    }
    prometheus::Registry registry;
    aggregator::AggregatorMetrics metrics;
    std::unique_ptr<aggregator::AggregatorCore> core;
  };
  // Ends with CANCELLED when destroyed, as a cancelled stream does.
  class Watch final : public aggregator::AggregatorWatch {
   public:
    Watch(aggregator::AggregatorCore& core, uint64_t handle, WatchDoneFn on_done)
        : core_(core), handle_(handle), on_done_(std::move(on_done)) {}
    ~Watch() override {
      core_.Unwatch(handle_);
      on_done_(absl::CancelledError("watch cancelled"));
    }

   private:
    aggregator::AggregatorCore& core_;
    const uint64_t handle_;
    const WatchDoneFn on_done_;
  };

  Instance& Get(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Instance>& slot = instances_[address];
    if (slot == nullptr) slot = std::make_unique<Instance>(clock_);
    return *slot;
  }

  const Clock& clock_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Instance>> instances_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::fakes
