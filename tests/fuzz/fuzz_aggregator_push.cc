// The aggregator's core fed a session from the input: UpdateMeta messages parsed from bytes start
// pushes (into rounds, or with round 0 into a federated-async buffer), whose frames are raw
// TensorFrames or well-formed encodings of fuzzed deltas; pushes are accepted, folded, rejected
// or dropped in any order among OpenRound and OpenBuffer (with fuzzed strategies and async
// settings), CloseRound, PutModel, SetMembers and ReleaseTask. A model the core serves must
// match its layout; finite updates and models of moderate size never aggregate into a
// non-finite model; no staging buffer or buffered update is left counted at the end.

#include <fuzzer/FuzzedDataProvider.h>
#include <prometheus/registry.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "libs/common/clock.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_core.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_log.h"
#include "tests/fuzz/fuzz_model_values.h"
#include "tests/testing/fake_clock.h"

namespace shoal::aggregator {
namespace {

using shoal::testing::FakeClock;

using fuzz::CheckErrorIsClean;

using fuzz::FuzzedValue;
using fuzz::SmallLayout;

tensor::FlatModel Model(FuzzedDataProvider& in) {
  tensor::FlatModel model;
  model.layout = SmallLayout();
  model.values.resize(SmallLayout().total_elements());
  for (float& v : model.values) v = FuzzedValue(in);
  return model;
}

// Sums of values this large may overflow a float: the finiteness check then no longer applies.
bool Moderate(const tensor::FlatModel& model) {
  for (float v : model.values) {
    if (!(std::fabs(v) <= 1e30f)) return false;
  }
  return true;
}

// The aggregation of a round or buffer: each registered strategy with plausible (sometimes
// invalid) options, or any bytes.
v1::AggregationSettings Aggregation(FuzzedDataProvider& in) {
  v1::AggregationSettings settings;
  common::v1::AggregationOptions& options = *settings.mutable_options();
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      break;  // unspecified: mean
    case 1:
      settings.set_strategy(common::v1::AGGREGATION_MEAN);
      break;
    case 2:
      settings.set_strategy(common::v1::AGGREGATION_MEDIAN);
      break;
    case 3:
      settings.set_strategy(common::v1::AGGREGATION_TRIMMED_MEAN);
      if (in.ConsumeBool()) options.set_trim_ratio(in.ConsumeFloatingPointInRange(0.0, 0.6));
      break;
    case 4:
      settings.set_strategy(in.ConsumeBool() ? common::v1::AGGREGATION_KRUM
                                             : common::v1::AGGREGATION_MULTI_KRUM);
      if (in.ConsumeBool()) options.set_byzantine_peers(in.ConsumeIntegralInRange(0, 2));
      if (settings.strategy() == common::v1::AGGREGATION_MULTI_KRUM && in.ConsumeBool()) {
        options.set_multi_krum_selected(in.ConsumeIntegralInRange(0, 4));
      }
      break;
    case 5:
      settings.set_strategy(common::v1::AGGREGATION_CENTERED_CLIPPING);
      if (in.ConsumeBool()) options.set_clip_radius(in.ConsumeFloatingPoint<double>());
      if (in.ConsumeBool()) options.set_clip_iterations(in.ConsumeIntegralInRange(0, 4));
      break;
    default:
      if (!settings.ParseFromString(in.ConsumeRandomLengthString(32))) settings.Clear();
  }
  return settings;
}

common::v1::AsyncSpec Async(FuzzedDataProvider& in) {
  common::v1::AsyncSpec async;
  if (in.ConsumeProbability<float>() < 0.9f) {
    async.set_buffer_size(in.ConsumeIntegralInRange(0, 4));
  }
  if (in.ConsumeBool()) async.set_max_staleness(in.ConsumeIntegralInRange(0, 3));
  async.set_staleness(static_cast<common::v1::StalenessWeighting>(in.ConsumeIntegralInRange(0, 4)));
  if (in.ConsumeBool()) async.set_staleness_a(in.ConsumeFloatingPoint<double>());
  if (in.ConsumeBool()) async.set_staleness_b(in.ConsumeIntegralInRange(0, 4));
  return async;
}

OpenBufferParams BufferParams(FuzzedDataProvider& in, const std::string& task) {
  OpenBufferParams p;
  p.task = task;
  p.base_version = in.ConsumeIntegralInRange<uint64_t>(0, 4);
  p.async = Async(in);
  p.aggregation = Aggregation(in);
  p.max_update_norm = in.ConsumeBool() ? 0 : in.ConsumeFloatingPoint<double>();
  p.last_version = in.ConsumeIntegralInRange<uint64_t>(0, 6);
  return p;
}

std::string Peer(FuzzedDataProvider& in) {
  static const char* kPeers[] = {"a", "b", "c", ""};
  if (in.ConsumeProbability<float>() < 0.1f) return in.ConsumeRandomLengthString(8);
  return kPeers[in.ConsumeIntegralInRange(0, 3)];
}

// Feeds a whole encoded delta, as frames or as chunk pieces; clears `moderate` for a huge one
// (one with a non-finite value is refused whole).
absl::Status FeedModel(FuzzedDataProvider& in, AggregatorCore::Push& push, bool& moderate) {
  const tensor::FlatModel delta = Model(in);
  bool finite = true;
  for (float v : delta.values) finite = finite && std::isfinite(v);
  if (finite && !Moderate(delta)) moderate = false;
  tensor::FrameEncoder encoder(delta, in.ConsumeIntegralInRange<size_t>(1, 40));
  common::v1::TensorFrame frame;
  while (encoder.Next(&frame)) {
    absl::Status s;
    if (frame.has_chunk() && in.ConsumeBool()) {
      const std::string& chunk = frame.chunk();
      const size_t cut = in.ConsumeIntegralInRange<size_t>(0, chunk.size());
      const absl::string_view parts[] = {absl::string_view(chunk).substr(0, cut),
                                         absl::string_view(chunk).substr(cut)};
      s = push.AddChunkParts(parts);
    } else {
      s = push.AddFrame(frame);
    }
    if (!s.ok()) return s;
    frame.Clear();
  }
  return absl::OkStatus();
}

void CheckServed(const AggregatorCore& core, const std::string& task,
                 std::optional<uint64_t> version, bool finite_inputs) {
  absl::StatusOr<ModelSnapshot> snapshot = core.GetModel(task, version);
  CheckErrorIsClean(snapshot.status());
  if (!snapshot.ok()) return;
  SHOAL_FUZZ_CHECK(snapshot->model != nullptr);
  const tensor::FlatModel& model = *snapshot->model;
  SHOAL_FUZZ_CHECK(model.values.size() == model.layout.total_elements());
  if (finite_inputs) {
    for (float v : model.values) SHOAL_FUZZ_CHECK(std::isfinite(v));
  }
}

void Run(FuzzedDataProvider& in) {
  prometheus::Registry registry;
  AggregatorMetrics metrics(registry);
  FakeClock clock;
  AggregatorCoreOptions options;
  options.max_concurrent_pushes = 2;
  options.closed_rounds_kept = 2;
  options.fold_threads = 1;
  options.limits.max_tensors = 8;
  options.limits.max_total_bytes = 1 << 12;
  // Three updates: a median round of four peers, or a buffer of four, is refused.
  options.max_buffer_bytes = 3 * SmallLayout().total_bytes();
  auto made = AggregatorCore::Create(options, clock, metrics);
  SHOAL_FUZZ_CHECK(made.ok());
  AggregatorCore& core = **made;
  const std::string task = "t";
  // Only finite base models are stored here, so every published model must be finite too
  // (updates are checked for finiteness and, with a bound, for their norm).
  tensor::FlatModel base;
  base.layout = SmallLayout();
  base.values.assign(SmallLayout().total_elements(), 0.5f);
  SHOAL_FUZZ_CHECK(core.PutModel(task, 1, base).ok());
  bool finite_models = true;
  uint64_t round = 1;
  OpenRoundParams first;
  first.task = task;
  first.round = round;
  first.base_version = 1;
  first.expected_peers = {"a", "b", "c"};
  CheckErrorIsClean(core.OpenRound(first));

  std::vector<std::unique_ptr<AggregatorCore::Push>> pushes;
  const int steps = in.ConsumeIntegralInRange(1, 40);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    const size_t which =
        pushes.empty() ? 0 : in.ConsumeIntegralInRange<size_t>(0, pushes.size() - 1);
    AggregatorCore::Push* push = pushes.empty() ? nullptr : pushes[which].get();
    switch (in.ConsumeIntegralInRange(0, 10)) {
      case 0: {  // a push from a session message
        v1::UpdateMeta m;
        if (!m.ParseFromString(in.ConsumeRandomLengthString(128))) break;
        if (in.ConsumeBool()) m.set_task(task);
        if (in.ConsumeBool()) m.set_peer_id(Peer(in));
        if (in.ConsumeBool()) m.set_round(0);  // the buffer
        if (in.ConsumeBool()) m.set_base_version(in.ConsumeIntegralInRange<uint64_t>(0, 6));
        if (in.ConsumeBool()) m.set_num_samples(in.ConsumeIntegralInRange<uint64_t>(1, 5));
        PushMeta meta{
            m.task(),        m.round(),      m.peer_id(),       m.base_version(),
            m.num_samples(), m.train_loss(), m.session_token(), in.ConsumeBool() ? "" : Peer(in)};
        auto begun = core.BeginPush(meta);
        CheckErrorIsClean(begun.status());
        if (begun.ok() && *begun != nullptr) pushes.push_back(*std::move(begun));
        break;
      }
      case 1:
        if (push != nullptr) {
          common::v1::TensorFrame frame;
          if (frame.ParseFromString(in.ConsumeRandomLengthString(256))) {
            CheckErrorIsClean(push->AddFrame(frame));
          }
        }
        break;
      case 2:
        if (push != nullptr) CheckErrorIsClean(FeedModel(in, *push, finite_models));
        break;
      case 3:
        if (push != nullptr) {
          switch (in.ConsumeIntegralInRange(0, 3)) {
            case 0:
              CheckErrorIsClean(push->Commit());
              break;
            case 1:
              CheckErrorIsClean(push->Accept());
              break;
            case 2:
              push->Fold();
              break;
            default:
              push->Reject(RejectReason::kIncomplete);
          }
        }
        break;
      case 4:
        if (push != nullptr) pushes.erase(pushes.begin() + static_cast<std::ptrdiff_t>(which));
        break;
      case 5: {
        const uint64_t number =
            in.ConsumeBool() ? round : in.ConsumeIntegralInRange<uint64_t>(0, 4);
        absl::StatusOr<RoundResult> result = core.CloseRound(task, number);
        CheckErrorIsClean(result.status());
        if (result.ok()) CheckServed(core, task, result->version, finite_models);
        break;
      }
      case 6: {
        OpenRoundParams params;
        params.task = task;
        params.round = in.ConsumeIntegralInRange<uint64_t>(0, 4);
        params.base_version = in.ConsumeIntegralInRange<uint64_t>(0, 3);
        const int n = in.ConsumeIntegralInRange(0, 4);
        for (int i = 0; i < n; ++i) params.expected_peers.push_back(Peer(in));
        const int late = in.ConsumeIntegralInRange(0, 2);  // stragglers: late updates
        for (int i = 0; i < late; ++i) params.late_peers.push_back(Peer(in));
        if (late > 0) params.late_staleness = Async(in);
        params.max_update_norm = in.ConsumeBool() ? 0 : in.ConsumeFloatingPoint<double>();
        params.aggregation = Aggregation(in);
        absl::Status s = core.OpenRound(params);
        CheckErrorIsClean(s);
        if (s.ok()) round = params.round;
        break;
      }
      case 10:
        CheckErrorIsClean(core.OpenBuffer(BufferParams(in, task)));
        break;
      case 7: {
        tensor::FlatModel model = Model(in);
        bool finite = true;
        for (float v : model.values) finite = finite && std::isfinite(v);
        const uint64_t version = in.ConsumeIntegralInRange<uint64_t>(0, 4);
        const std::string name = in.ConsumeBool() ? task : "u";
        absl::StatusOr<PutResult> put = core.PutModel(name, version, model);
        CheckErrorIsClean(put.status());
        if (put.ok() && name == task && (!finite || !Moderate(model))) finite_models = false;
        break;
      }
      case 8: {
        std::map<std::string, std::string> tokens;
        const int n = in.ConsumeIntegralInRange(0, 3);
        for (int i = 0; i < n; ++i) tokens[Peer(in)] = in.ConsumeRandomLengthString(8);
        core.SetMembers(task, std::move(tokens));
        break;
      }
      default:
        if (in.ConsumeBool()) {
          core.ReleaseTask(task);
        } else {
          clock.Advance(absl::Seconds(in.ConsumeIntegralInRange(0, 100)));
        }
    }
    CheckServed(core, task, std::nullopt, finite_models);
  }
  pushes.clear();  // accepted pushes fold (or aggregate their buffer) on destruction
  SHOAL_FUZZ_CHECK(metrics.pushes_in_flight.Value() == 0);
  SHOAL_FUZZ_CHECK(metrics.buffered_updates.Value() >= 0);
  absl::StatusOr<RoundResult> result = core.CloseRound(task, round);
  CheckErrorIsClean(result.status());
  if (result.ok()) CheckServed(core, task, result->version, finite_models);
  CheckServed(core, task, std::nullopt, finite_models);
  core.ReleaseTask(task);
  SHOAL_FUZZ_CHECK(metrics.buffered_updates.Value() == 0);
}

}  // namespace
}  // namespace shoal::aggregator

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::LogOnlyWhenReplaying(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  shoal::aggregator::Run(in);
  return 0;
}
