#pragma once

// What aggregator_core_test and aggregator_buffer_test share: a small model layout, an
// AggregatorCore with a fake clock and its metrics, and helpers that stream updates through
// pushes and record a task's events.

#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "libs/common/clock.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_core.h"
#include "tests/testing/fake_clock.h"

namespace shoal::aggregator {

using shoal::testing::FakeClock;

// 13 floats, 52 bytes.
inline tensor::ModelLayout Layout() {
  return *tensor::ModelLayout::Create({{"conv.weight", {2, 3}}, {"conv.bias", {2}}, {"fc", {5}}});
}

inline tensor::FlatModel Filled(std::function<float(size_t)> f,
                                tensor::ModelLayout layout = Layout()) {
  tensor::FlatModel m;
  m.layout = std::move(layout);
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = f(i);
  return m;
}

inline v1::AggregationSettings StrategySettings(common::v1::Aggregation kind,
                                                common::v1::AggregationOptions options = {}) {
  v1::AggregationSettings settings;
  settings.set_strategy(kind);
  *settings.mutable_options() = std::move(options);
  return settings;
}

// Every event of one watch, in the order delivered.
class EventLog {
 public:
  AggregatorCore::TaskEventFn Recorder() {
    return [this](const v1::TaskEvent& event) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    };
  }
  std::vector<v1::TaskEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<v1::VersionPublished> Published() const {
    std::vector<v1::VersionPublished> out;
    for (const v1::TaskEvent& e : events()) {
      if (e.has_version_published()) out.push_back(e.version_published());
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::TaskEvent> events_ ABSL_GUARDED_BY(mu_);
};

class AggregatorCoreFixture : public ::testing::Test {
 protected:
  void SetUp() override { Make(4); }

  void Make(int max_pushes, uint64_t max_buffer_bytes = uint64_t{4} << 30) {
    core_.reset();
    metrics_ = std::make_unique<AggregatorMetrics>(registry_);
    AggregatorCoreOptions options;
    options.max_concurrent_pushes = max_pushes;
    options.max_buffer_bytes = max_buffer_bytes;
    auto core = AggregatorCore::Create(options, clock_, *metrics_);
    ASSERT_TRUE(core.ok());
    core_ = *std::move(core);
  }

  PushMeta Meta(const std::string& peer, uint64_t samples, uint64_t round = 1, uint64_t base = 0) {
    return PushMeta{"t", round, peer, base, samples, 0.5};
  }

  // A push of `delta` with every frame fed, not yet accepted.
  absl::StatusOr<std::unique_ptr<AggregatorCore::Push>> Streamed(const PushMeta& meta,
                                                                 const tensor::FlatModel& delta,
                                                                 size_t drop_last_frames = 0) {
    auto push = core_->BeginPush(meta);
    if (!push.ok() || *push == nullptr) return push;
    std::vector<common::v1::TensorFrame> frames;
    tensor::FrameEncoder enc(delta, 16);
    common::v1::TensorFrame f;
    while (enc.Next(&f)) frames.push_back(f);
    frames.resize(frames.size() - drop_last_frames);
    for (const auto& frame : frames) {
      absl::Status s = (*push)->AddFrame(frame);
      if (!s.ok()) return s;
    }
    return push;
  }

  // Streams `delta` through a push and commits it; returns the push's final status.
  // `duplicate`: whether the aggregator answered duplicate=true.
  absl::Status PushModel(const PushMeta& meta, const tensor::FlatModel& delta,
                         bool* duplicate = nullptr, size_t drop_last_frames = 0) {
    auto push = Streamed(meta, delta, drop_last_frames);
    if (!push.ok()) return push.status();
    if (*push == nullptr) {
      if (duplicate) *duplicate = true;
      return absl::OkStatus();
    }
    absl::Status s = (*push)->Commit();
    if (duplicate) *duplicate = (*push)->duplicate();
    return s;
  }

  void PutBase() {
    auto put = core_->PutModel("t", 0, Filled([](size_t i) { return 1.0f * i; }));
    ASSERT_TRUE(put.ok()) << put.status();
  }

  void Open(std::vector<std::string> peers, uint64_t round = 1, uint64_t base = 0,
            double max_norm = 0) {
    absl::Status s = core_->OpenRound({"t", round, base, std::move(peers), max_norm});
    ASSERT_TRUE(s.ok()) << s;
  }

  double Rejected(RejectReason r) { return metrics_->RejectedCounter(r).Value(); }
  double TotalRejected() {
    double total = 0;
    for (int i = 0; i < kNumRejectReasons; ++i) total += Rejected(static_cast<RejectReason>(i));
    return total;
  }

  prometheus::Registry registry_;
  FakeClock clock_;
  std::unique_ptr<AggregatorMetrics> metrics_;
  std::unique_ptr<AggregatorCore> core_;
};

}  // namespace shoal::aggregator
