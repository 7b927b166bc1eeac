// Tree rounds at the aggregator's core, fed from the input: child partial sums arrive as
// PartialMetas parsed from bytes with any bytes after them, or as well-formed sums of fuzzed
// updates (exact or float) with one field or the bytes spoiled, through PartialReceiver into
// AddPartial, among direct pushes, ClosePartial (a child's close), CloseRound and new rounds.
// Every round that publishes counts each contribution it acknowledged exactly once (its samples
// are the sum of the accepted partials' and pushes'); finite inputs of moderate size never
// publish a non-finite model; error messages are printable.
// Federated-async trees the same way: children's aggregates (round 0, total weight 1) into an
// open buffer, at the root or at a node that forwards its full buffers, among a peer's pushes
// and reopenings with other sizes; what is published or forwarded stays finite.

#include <fuzzer/FuzzedDataProvider.h>
#include <prometheus/registry.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "libs/aggregation/weighted_mean.h"
#include "libs/common/clock.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/partial_wire.h"
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

std::string Child(FuzzedDataProvider& in) {
  static const char* kIds[] = {"a", "b", "p", "q", ""};
  return kIds[in.ConsumeIntegralInRange(0, 4)];
}

struct State {
  uint64_t round = 1;
  uint64_t base = 0;     // the open round's base version
  uint64_t samples = 0;  // acknowledged in the open round: accepted partials and pushes
  bool moderate = true;  // every acknowledged value finite and of moderate size
};

// A child's sum of 0..3 fuzzed updates, sent (maybe spoiled) through the receiver. For a
// buffer (`state.round` 0), a child's aggregate: float, weights adding up to 1.
absl::StatusOr<bool> SendPartial(FuzzedDataProvider& in, AggregatorCore& core, State& state,
                                 bool exact) {
  const bool buffer = state.round == 0;
  const aggregation::Summation summation = !buffer && exact != in.ConsumeBool()
                                               ? aggregation::Summation::kExact
                                               : aggregation::Summation::kFloat;
  aggregation::WeightedMeanAccumulator sum(SmallLayout(), 1, summation);
  PartialResult partial;
  partial.meta.task = "t";
  partial.meta.round = in.ConsumeBool() ? state.round : in.ConsumeIntegralInRange<uint64_t>(0, 3);
  partial.meta.base_version = in.ConsumeBool() ? state.base : in.ConsumeIntegral<uint8_t>();
  bool moderate = true;
  const int updates = in.ConsumeIntegralInRange(0, buffer ? 2 : 3);
  for (int u = 0; u < updates; ++u) {
    std::vector<float> delta(SmallLayout().total_elements());
    for (float& v : delta) {
      v = FuzzedValue(in);
      moderate = moderate && std::fabs(v) <= 1e6f;
    }
    const uint64_t samples = in.ConsumeIntegralInRange<uint64_t>(1, 1000);
    const double weight = buffer ? 1.0 / updates : static_cast<double>(samples);
    if (!sum.Add(delta, weight).ok()) continue;
    partial.meta.contributors.push_back(
        absl::StrCat("c", state.round, "-", in.ConsumeIntegralInRange(0, 5), "-", u));
    partial.meta.num_samples += samples;
  }
  partial.sum = sum.Partial();
  v1::PartialMeta meta = PartialMetaFor(partial, Child(in));
  std::string bytes(PartialBytes(partial.sum));
  switch (in.ConsumeIntegralInRange(0, 6)) {
    case 0: {  // any meta
      v1::PartialMeta other;
      if (other.ParseFromString(in.ConsumeRandomLengthString(256))) meta = other;
      break;
    }
    case 1:
      if (!bytes.empty()) bytes[in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1)] ^= 1;
      break;
    case 2:
      bytes.resize(in.ConsumeIntegralInRange<size_t>(0, bytes.size() + 16));
      break;
    case 3:
      meta.set_values(in.ConsumeIntegral<uint16_t>());
      break;
    case 4:
      meta.add_contributors(in.ConsumeRandomLengthString(8));
      break;
    default:
      break;  // as sent
  }
  absl::StatusOr<size_t> values = core.PartialValues(meta.task(), meta.round());
  if (!values.ok()) return values.status();
  absl::StatusOr<PartialReceiver> receiver = PartialReceiver::Start(meta, *values);
  if (!receiver.ok()) return receiver.status();
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(1, bytes.size() - at);
    if (absl::Status s = receiver->Add(absl::string_view(bytes).substr(at, n)); !s.ok()) return s;
    at += n;
  }
  absl::StatusOr<PartialResult> received = std::move(*receiver).Finish();
  if (!received.ok()) return received.status();
  absl::StatusOr<bool> added = core.AddPartial(received->meta, received->sum);
  if (added.ok() && !*added) {
    state.samples += received->meta.num_samples;
    state.moderate = state.moderate && moderate;
  }
  return added;
}

// A push of `meta` whose delta is one fuzzed value throughout; true when it was accepted.
bool PushConstant(FuzzedDataProvider& in, AggregatorCore& core, const PushMeta& meta) {
  auto push = core.BeginPush(meta);
  CheckErrorIsClean(push.status());
  if (!push.ok() || *push == nullptr) return false;
  tensor::FlatModel delta;
  delta.layout = SmallLayout();
  delta.values.assign(SmallLayout().total_elements(), in.ConsumeFloatingPointInRange(-1.f, 1.f));
  tensor::FrameEncoder encoder(delta, 16);
  common::v1::TensorFrame frame;
  absl::Status s;
  while (s.ok() && encoder.Next(&frame)) s = (*push)->AddFrame(frame);
  if (s.ok()) s = (*push)->Commit();
  CheckErrorIsClean(s);
  return s.ok();
}

void CheckPublished(const AggregatorCore& core, const RoundResult& result, const State& state) {
  SHOAL_FUZZ_CHECK(result.num_samples == state.samples);
  std::set<std::string> unique(result.contributors.begin(), result.contributors.end());
  SHOAL_FUZZ_CHECK(unique.size() == result.contributors.size());
  absl::StatusOr<ModelSnapshot> model = core.GetModel("t", result.version);
  SHOAL_FUZZ_CHECK(model.ok());
  SHOAL_FUZZ_CHECK(model->model->layout == SmallLayout());
  if (state.moderate) {
    for (float v : model->model->values) SHOAL_FUZZ_CHECK(std::isfinite(v));
  }
}

// The task's latest version: finite when every input was moderate.
void CheckLatest(const AggregatorCore& core, const State& state) {
  absl::StatusOr<ModelSnapshot> model = core.GetModel("t", std::nullopt);
  SHOAL_FUZZ_CHECK(model.ok());
  SHOAL_FUZZ_CHECK(model->model->layout == SmallLayout());
  if (state.moderate) {
    for (float v : model->model->values) SHOAL_FUZZ_CHECK(std::isfinite(v));
  }
}

// A parent aggregator that keeps what it is sent (on the core's transfer thread) and takes or
// refuses it.
class FuzzParent final : public ParentLink {
 public:
  explicit FuzzParent(bool accept) : accept_(accept) {}
  absl::Status Send(const v1::ParentRound&, const PartialResult& aggregate, absl::Time) override {
    absl::MutexLock lock(&mu_);
    forwarded_.push_back(aggregate);
    return accept_ ? absl::OkStatus() : absl::FailedPreconditionError("refused");
  }
  std::vector<PartialResult> Forwarded() {
    absl::MutexLock lock(&mu_);
    return forwarded_;
  }

 private:
  const bool accept_;
  absl::Mutex mu_;
  std::vector<PartialResult> forwarded_ ABSL_GUARDED_BY(mu_);
};

// A federated-async buffer with children "a" and "b": the root's, or (`forwards`) a node's
// below it whose full buffers go to the forwarder.
void RunBuffer(FuzzedDataProvider& in, AggregatorCore& core, bool median) {
  const bool forwards = in.ConsumeBool();
  // The parent takes every aggregate, or refuses them (not retried: each is lost and counted).
  FuzzParent parent(in.ConsumeBool());
  core.SetParentLink(&parent);
  OpenBufferParams params;
  params.task = "t";
  params.children = {"a", "b"};
  if (forwards) {
    params.parent.set_address("127.0.0.1:1");
    params.parent.set_child("n");
  }
  if (median) params.aggregation.set_strategy(common::v1::AGGREGATION_MEDIAN);
  State state;
  state.round = 0;
  auto open = [&] {
    params.base_version = core.GetModel("t", std::nullopt)->version;
    params.async.set_buffer_size(in.ConsumeIntegralInRange(1, 4));
    CheckErrorIsClean(core.OpenBuffer(params));
  };
  open();
  const int steps = in.ConsumeIntegralInRange(1, 24);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    state.base = core.GetModel("t", std::nullopt)->version;
    switch (in.ConsumeIntegralInRange(0, 3)) {
      case 0:
      case 1:
        CheckErrorIsClean(SendPartial(in, core, state, false).status());
        break;
      case 2: {  // a peer of this node's own
        const uint64_t base = in.ConsumeBool() ? state.base : in.ConsumeIntegral<uint8_t>();
        PushConstant(in, core, PushMeta{"t", 0, in.ConsumeBool() ? "p" : "q", base, 3, 0.5});
        break;
      }
      default:  // the coordinator reopens it (another size: the waiting updates stay)
        open();
    }
  }
  CheckLatest(core, state);
  core.AwaitTransfers();
  core.SetParentLink(nullptr);
  for (const PartialResult& aggregate : parent.Forwarded()) {
    SHOAL_FUZZ_CHECK(aggregate.meta.round == 0);
    SHOAL_FUZZ_CHECK(aggregate.sum.sum.size() == SmallLayout().total_elements());
    SHOAL_FUZZ_CHECK(aggregate.meta.num_samples >= aggregate.meta.contributors.size());
    if (state.moderate) {
      for (float v : aggregate.sum.sum) SHOAL_FUZZ_CHECK(std::isfinite(v));
    }
  }
}

void Run(FuzzedDataProvider& in) {
  prometheus::Registry registry;
  AggregatorMetrics metrics(registry);
  FakeClock clock;
  auto made = AggregatorCore::Create(AggregatorCoreOptions{}, clock, metrics);
  SHOAL_FUZZ_CHECK(made.ok());
  AggregatorCore& core = **made;
  tensor::FlatModel base;
  base.layout = SmallLayout();
  base.values.assign(SmallLayout().total_elements(), 0.5f);
  SHOAL_FUZZ_CHECK(core.PutModel("t", 0, base).ok());
  // Mean (float or exact), or median: a robust strategy runs within the cluster and takes its
  // children's sums beside its own result.
  const int kind = in.ConsumeIntegralInRange(0, 4);
  if (kind >= 3) {  // federated-async: mean or median buffers
    RunBuffer(in, core, kind == 4);
    return;
  }
  const bool exact = kind == 1;
  State state;
  auto open = [&](uint64_t round, uint64_t base) {
    OpenRoundParams params{"t", round, base, {"p"}};
    params.expected_children = {"a", "b"};
    if (exact) params.aggregation.mutable_options()->set_exact_sum(true);
    if (kind == 2) params.aggregation.set_strategy(common::v1::AGGREGATION_MEDIAN);
    absl::Status s = core.OpenRound(params);
    CheckErrorIsClean(s);
    if (s.ok()) {
      state.round = round;
      state.base = base;
      state.samples = 0;
    }
  };
  open(1, 0);
  const int steps = in.ConsumeIntegralInRange(1, 24);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange(0, 4)) {
      case 0:
      case 1:
        CheckErrorIsClean(SendPartial(in, core, state, exact).status());
        break;
      case 2:  // the round's own peer
        if (PushConstant(in, core, PushMeta{"t", state.round, "p", state.base, 3, 0.5})) {
          state.samples += 3;
        }
        break;
      case 3: {  // this aggregator as a child: its partial, published nowhere
        auto partial = core.ClosePartial("t", state.round);
        CheckErrorIsClean(partial.status());
        if (partial.ok()) {
          SHOAL_FUZZ_CHECK((*partial)->meta.num_samples == state.samples);
          open(state.round + 1, state.base);
        }
        break;
      }
      default: {
        absl::StatusOr<RoundResult> result = core.CloseRound("t", state.round);
        CheckErrorIsClean(result.status());
        if (result.ok()) {
          CheckPublished(core, *result, state);
          open(state.round + 1, result->version);
        }
      }
    }
  }
  absl::StatusOr<RoundResult> result = core.CloseRound("t", state.round);
  CheckErrorIsClean(result.status());
  if (result.ok()) CheckPublished(core, *result, state);
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
