// The decentralized round's aggregate (AggregateRound): the task's strategy over the deltas
// against the round's base, bit-identical at every participant whatever order the updates
// arrived in, with updates over max_update_norm left out everywhere.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/aggregation/strategy.h"
#include "libs/aggregation/update_validation.h"
#include "libs/tensor/buffer_pool.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/modes/decentralized/aggregate.h"

namespace shoal::peer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

tensor::ModelLayout Layout(std::vector<int64_t> weight = {3, 4}) {
  absl::StatusOr<tensor::ModelLayout> layout =
      tensor::ModelLayout::Create({{"a.weight", weight}, {"a.bias", {5}}});
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

tensor::FlatModel Filled(const tensor::ModelLayout& layout, float value) {
  tensor::FlatModel m;
  m.layout = layout;
  m.values.assign(layout.total_elements(), value);
  return m;
}

// base + a random delta of about `scale` per element.
std::shared_ptr<const tensor::FlatModel> Trained(const tensor::FlatModel& base, uint32_t seed,
                                                 float scale = 0.1f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  auto m = std::make_shared<tensor::FlatModel>(base);
  for (float& v : m->values) v += dist(gen);
  return m;
}

aggregation::Strategy Make(common::v1::Aggregation kind) {
  aggregation::StrategyOptions options;
  options.kind = kind;
  absl::StatusOr<aggregation::Strategy> s = aggregation::MakeStrategy(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

aggregation::Strategy ExactMean() {
  aggregation::StrategyOptions options;
  options.kind = common::v1::AGGREGATION_MEAN;
  options.params.set_exact_sum(true);
  absl::StatusOr<aggregation::Strategy> s = aggregation::MakeStrategy(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Six participants' updates of `base`, peer-0 to peer-5, trained from seeds `seed` onwards.
std::vector<PeerUpdate> SixUpdates(const tensor::FlatModel& base, uint32_t seed) {
  std::vector<PeerUpdate> updates;
  for (uint32_t i = 0; i < 6; ++i) {
    updates.push_back(PeerUpdate{"peer-" + std::to_string(i), 10 + i, Trained(base, seed + i)});
  }
  return updates;
}

std::vector<std::string> IdsOf(const std::vector<PeerUpdate>& updates) {
  std::vector<std::string> ids;
  for (const PeerUpdate& u : updates) ids.push_back(u.peer_id);
  return ids;
}

bool SameBytes(const tensor::FlatModel& a, const tensor::FlatModel& b) {
  return a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

TEST(AggregateRoundTest, MeanWeighsTheDeltasBySamples) {
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 0.5f);
  auto a = std::make_shared<const tensor::FlatModel>(Filled(layout, 1.0f));
  auto b = std::make_shared<const tensor::FlatModel>(Filled(layout, 4.0f));
  absl::StatusOr<RoundAggregate> r =
      AggregateRound(Make(common::v1::AGGREGATION_MEAN), base,
                     {PeerUpdate{"p2", 100, b}, PeerUpdate{"p1", 300, a}}, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model.layout, layout);
  for (float v : r->model.values) EXPECT_FLOAT_EQ(v, (300 * 1.0f + 100 * 4.0f) / 400);
  EXPECT_THAT(r->included, ElementsAre("p1", "p2"));
  EXPECT_THAT(r->excluded, IsEmpty());
  EXPECT_EQ(r->num_samples, 400u);
  EXPECT_EQ(r->note, "");
}

// A compressed task's updates are deltas (PeerUpdate.delta): folded as they are, not against the
// base, with the same weights and the same norm bound as models.
TEST(AggregateRoundTest, DeltasAreFoldedAsTheyAre) {
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 0.5f);
  auto a = std::make_shared<const tensor::FlatModel>(Filled(layout, 1.0f));
  auto b = std::make_shared<const tensor::FlatModel>(Filled(layout, -3.0f));
  absl::StatusOr<RoundAggregate> r =
      AggregateRound(Make(common::v1::AGGREGATION_MEAN), base,
                     {PeerUpdate{"p2", 100, b, /*delta=*/true}, PeerUpdate{"p1", 300, a, true}}, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  for (float v : r->model.values) EXPECT_FLOAT_EQ(v, 0.5f + (300 * 1.0f - 100 * 3.0f) / 400);
  EXPECT_THAT(r->included, ElementsAre("p1", "p2"));
  // The bound applies to the delta itself: b's norm is 3 x sqrt(17) = 12.4.
  r = AggregateRound(Make(common::v1::AGGREGATION_MEAN), base,
                     {PeerUpdate{"p2", 100, b, true}, PeerUpdate{"p1", 300, a, true}}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->included, ElementsAre("p1"));
  ASSERT_EQ(r->excluded.size(), 1u);
  EXPECT_EQ(r->excluded[0].peer_id, "p2");
  for (float v : r->model.values) EXPECT_FLOAT_EQ(v, 1.5f);
}

class AnyOrderTest : public ::testing::TestWithParam<common::v1::Aggregation> {};

// Two participants that received the same updates in different orders (and every other order
// tried) end the round with bit-identical models.
TEST_P(AnyOrderTest, ParticipantsEndBitIdenticalWhateverTheArrivalOrder) {
  const aggregation::Strategy strategy = Make(GetParam());
  const tensor::ModelLayout layout = Layout({64, 33});
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  tensor::FlatModel base = Filled(layout, 0);
  for (float& v : base.values) v = dist(gen);
  std::vector<PeerUpdate> updates;
  for (int i = 0; i < 7; ++i) {
    updates.push_back(PeerUpdate{"peer-" + std::to_string(i), static_cast<uint64_t>(100 + 37 * i),
                                 Trained(base, static_cast<uint32_t>(i + 1))});
  }
  absl::StatusOr<RoundAggregate> first = AggregateRound(strategy, base, updates, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(updates.begin(), updates.end(), gen);
    absl::StatusOr<RoundAggregate> again = AggregateRound(strategy, base, updates, 0);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(SameBytes(again->model, first->model)) << "order " << trial;
    EXPECT_EQ(again->model.Digest(), first->model.Digest());
    EXPECT_EQ(again->included, first->included);
  }
  // It is the configured strategy's result: check one coordinate by hand.
  std::vector<double> deltas;
  double weighted = 0;
  double total = 0;
  for (const PeerUpdate& u : updates) {
    const float d = u.model->values[0] - base.values[0];
    deltas.push_back(d);
    weighted += static_cast<double>(u.num_samples) * d;
    total += static_cast<double>(u.num_samples);
  }
  std::sort(deltas.begin(), deltas.end());
  const double want = GetParam() == common::v1::AGGREGATION_MEDIAN ? deltas[3] : weighted / total;
  EXPECT_NEAR(first->model.values[0], base.values[0] + want, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Strategies, AnyOrderTest,
                         ::testing::Values(common::v1::AGGREGATION_MEAN,
                                           common::v1::AGGREGATION_MEDIAN),
                         [](const auto& info) { return aggregation::StrategyName(info.param); });

TEST(AggregateRoundTest, AnUpdateOverTheNormBoundIsLeftOut) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 1.0f);
  auto a = Trained(base, 1);
  auto b = Trained(base, 2);
  auto big = Trained(base, 3, 100.0f);  // e.g. a Byzantine peer's scaled update
  std::vector<float> delta(base.values.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = big->values[i] - base.values[i];
  const double big_norm = aggregation::L2Norm(delta);
  ASSERT_GT(big_norm, 50);

  absl::StatusOr<RoundAggregate> bounded = AggregateRound(
      mean, base, {PeerUpdate{"a", 10, a}, PeerUpdate{"z", 10, big}, PeerUpdate{"b", 10, b}}, 50);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_THAT(bounded->included, ElementsAre("a", "b"));
  ASSERT_EQ(bounded->excluded.size(), 1u);
  EXPECT_EQ(bounded->excluded[0].peer_id, "z");
  EXPECT_THAT(bounded->excluded[0].reason, HasSubstr("max_update_norm"));
  EXPECT_EQ(bounded->num_samples, 20u);
  // Exactly the aggregate without it.
  absl::StatusOr<RoundAggregate> without =
      AggregateRound(mean, base, {PeerUpdate{"b", 10, b}, PeerUpdate{"a", 10, a}}, 0);
  ASSERT_TRUE(without.ok());
  EXPECT_TRUE(SameBytes(bounded->model, without->model));

  // Everything left out (or trained on nothing): the base model.
  absl::StatusOr<RoundAggregate> none =
      AggregateRound(mean, base, {PeerUpdate{"z", 10, big}, PeerUpdate{"empty", 0, a}}, 50);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(none->included, IsEmpty());
  ASSERT_EQ(none->excluded.size(), 2u);
  EXPECT_EQ(none->excluded[0].peer_id, "empty");
  EXPECT_THAT(none->excluded[0].reason, HasSubstr("0 samples"));
  EXPECT_TRUE(SameBytes(none->model, base));
  EXPECT_FALSE(none->note.empty());
}

TEST(AggregateRoundTest, RejectsBadInput) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 0);
  auto m = Trained(base, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(AggregateRound(mean, base, {}, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      AggregateRound(mean, base, {PeerUpdate{"p", 1, m}, PeerUpdate{"p", 1, m}}, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      AggregateRound(mean, base, {PeerUpdate{"p", 1, nullptr}}, 0).status()));
  auto other = Trained(Filled(Layout({4, 3}), 0), 2);
  absl::Status s =
      AggregateRound(mean, base, {PeerUpdate{"p", 1, m}, PeerUpdate{"q", 1, other}}, 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("layout"));
  auto nan = std::make_shared<tensor::FlatModel>(*m);
  nan->values[3] = std::nanf("");
  s = AggregateRound(mean, base, {PeerUpdate{"p", 1, m}, PeerUpdate{"q", 1, nan}}, 10).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("peer q"));
  // Finite values whose difference from the base overflows: an infinite delta, refused too.
  tensor::FlatModel low = base;
  low.values[5] = -3e38f;
  auto far = std::make_shared<tensor::FlatModel>(*m);
  far->values[5] = 3e38f;
  s = AggregateRound(mean, low, {PeerUpdate{"p", 1, m}, PeerUpdate{"q", 1, far}}, 0).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("peer q"));
  EXPECT_THAT(s.message(), HasSubstr("non-finite value inf"));
}

// RoundFold folds each update as soon as every lower id is in: offered in ascending order it
// holds none of them; offered in any order it ends with AggregateRound's model, bit for bit.
TEST(RoundFoldTest, FoldsInIdOrderAndHoldsOnlyEarlyArrivals) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout({32, 17});
  const tensor::FlatModel base = Filled(layout, 0.25f);
  const std::vector<PeerUpdate> updates = SixUpdates(base, 40);
  const std::vector<std::string> ids = IdsOf(updates);
  absl::StatusOr<RoundAggregate> want = AggregateRound(mean, base, updates, 0);
  ASSERT_TRUE(want.ok()) << want.status();

  absl::StatusOr<RoundFold> ascending = RoundFold::Start(mean, layout, ids, 0);
  ASSERT_TRUE(ascending.ok()) << ascending.status();
  for (const PeerUpdate& u : updates) {
    ASSERT_TRUE(ascending->Offer(u, base).ok());
    EXPECT_EQ(ascending->waiting(), 0u);
    EXPECT_TRUE(ascending->Has(u.peer_id));
  }
  ASSERT_TRUE(ascending->complete());
  absl::StatusOr<RoundAggregate> got = ascending->Finish(base);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(got->model, want->model));

  absl::StatusOr<RoundFold> reversed = RoundFold::Start(mean, layout, ids, 0);
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  for (size_t k = updates.size(); k-- > 1;) {
    ASSERT_TRUE(reversed->Offer(updates[k], base).ok());
    EXPECT_EQ(reversed->waiting(), updates.size() - k);
  }
  absl::StatusOr<RoundAggregate> early = reversed->Finish(base);
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("peer-0"));
  EXPECT_FALSE(reversed->Has("peer-0"));
  ASSERT_TRUE(reversed->Offer(updates[0], base).ok());
  EXPECT_EQ(reversed->waiting(), 0u);
  ASSERT_TRUE(reversed->complete());
  got = reversed->Finish(base);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(got->model, want->model));
  EXPECT_EQ(got->included, want->included);
  EXPECT_EQ(got->num_samples, want->num_samples);

  // Into a recycled buffer: its storage, its old values overwritten.
  std::vector<float> buffer(base.values.size(), 9.0f);
  const float* storage = buffer.data();
  got = reversed->Finish(base, std::move(buffer));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->model.values.data(), storage);
  EXPECT_TRUE(SameBytes(got->model, want->model));
}

// Updates that come before their turn wait in memory up to WaitingOptions::memory_bytes and on
// disk beyond it, and the fold still ends with AggregateRound's model, bit for bit. An update
// whose model is held elsewhere too waits in memory whatever the budget: writing it out would
// free nothing.
TEST(RoundFoldTest, UpdatesBeyondTheMemoryBudgetWaitOnDisk) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout({32, 17});
  const tensor::FlatModel base = Filled(layout, 0.25f);
  const std::vector<PeerUpdate> updates = SixUpdates(base, 70);
  absl::StatusOr<RoundAggregate> want = AggregateRound(mean, base, updates, 0);
  ASSERT_TRUE(want.ok()) << want.status();
  auto buffers = tensor::BufferPool::Create(2);
  absl::StatusOr<RoundFold> fold =
      RoundFold::Start(mean, layout, IdsOf(updates), 0,
                       WaitingOptions{layout.total_bytes(), ::testing::TempDir(), buffers});
  ASSERT_TRUE(fold.ok()) << fold.status();
  auto only_copy = [](const PeerUpdate& u) {  // the fold is its model's only holder
    return PeerUpdate{u.peer_id, u.num_samples, std::make_shared<tensor::FlatModel>(*u.model)};
  };
  for (size_t k = updates.size(); k-- > 1;) {
    ASSERT_TRUE(fold->Offer(only_copy(updates[k]), base).ok());
    EXPECT_TRUE(fold->Has(updates[k].peer_id));
  }
  EXPECT_EQ(fold->waiting(), 5u);
  EXPECT_EQ(fold->spilled(), 4u);  // one fits the budget
  ASSERT_TRUE(fold->Offer(only_copy(updates[0]), base).ok());
  ASSERT_TRUE(fold->complete());
  EXPECT_EQ(fold->waiting(), 0u);
  absl::StatusOr<RoundAggregate> got = fold->Finish(base);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(got->model, want->model));
  EXPECT_EQ(got->included, want->included);
  EXPECT_EQ(got->num_samples, want->num_samples);
  EXPECT_GE(buffers->kept(), 1u);  // what was read back went back to the pool once folded

  ASSERT_TRUE(fold->Restart(IdsOf(updates)).ok());
  EXPECT_EQ(fold->spilled(), 0u);
  for (size_t k = updates.size(); k-- > 1;) ASSERT_TRUE(fold->Offer(updates[k], base).ok());
  EXPECT_EQ(fold->spilled(), 0u);  // the test holds every model too
  EXPECT_EQ(fold->waiting(), 5u);
  fold->DropWaiting();  // a fold kept only for its buffers lets go of what waits
  EXPECT_EQ(fold->waiting(), 0u);
  EXPECT_FALSE(fold->Has(updates[5].peer_id));
}

// An update that cannot wait on disk is refused with the directory and the peer named, and is
// not taken: offered again where it can wait, the round completes.
TEST(RoundFoldTest, AnUpdateThatCannotWaitOnDiskIsRefusedByName) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 0);
  const std::string missing = ::testing::TempDir() + "/no-such-dir";
  absl::StatusOr<RoundFold> fold =
      RoundFold::Start(mean, layout, {"a", "b"}, 0, WaitingOptions{0, missing, nullptr});
  ASSERT_TRUE(fold.ok()) << fold.status();
  absl::Status s = fold->Offer(PeerUpdate{"b", 1, Trained(base, 2)}, base);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("peer b"));
  EXPECT_THAT(s.message(), HasSubstr(missing));
  EXPECT_FALSE(fold->Has("b"));
  ASSERT_TRUE(fold->Offer(PeerUpdate{"a", 1, Trained(base, 1)}, base).ok());
  ASSERT_TRUE(fold->Offer(PeerUpdate{"b", 1, Trained(base, 2)}, base).ok());
  EXPECT_TRUE(fold->complete());
}

// With an order-independent strategy (mean with exact sums) updates fold as they come: none
// waits for a lower id, and the result and its lists are those of the ascending fold.
TEST(RoundFoldTest, AnOrderIndependentFoldTakesUpdatesAsTheyCome) {
  const aggregation::Strategy exact_mean = ExactMean();
  EXPECT_TRUE(exact_mean.order_independent());
  EXPECT_FALSE(Make(common::v1::AGGREGATION_MEAN).order_independent());
  EXPECT_TRUE(Make(common::v1::AGGREGATION_MEDIAN).order_independent());

  const tensor::ModelLayout layout = Layout({32, 17});
  const tensor::FlatModel base = Filled(layout, 0.25f);
  std::vector<PeerUpdate> updates = SixUpdates(base, 60);
  updates[4].model = Trained(base, 64, 1.0f);  // norm about 23: left out everywhere
  absl::StatusOr<RoundAggregate> want = AggregateRound(exact_mean, base, updates, 5.0);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->excluded.size(), 1u);

  absl::StatusOr<RoundFold> fold = RoundFold::Start(exact_mean, layout, IdsOf(updates), 5.0);
  ASSERT_TRUE(fold.ok()) << fold.status();
  EXPECT_TRUE(fold->any_order());
  // As a participant fetching in rotated order would get them: 3, 4, 5, 1, then 0 last.
  for (int k : {3, 4, 5, 1}) {
    ASSERT_TRUE(fold->Offer(updates[k], base).ok());
    EXPECT_EQ(fold->waiting(), 0u);
    EXPECT_TRUE(fold->Has(updates[k].peer_id));
  }
  EXPECT_FALSE(fold->Has("peer-0"));
  absl::StatusOr<RoundAggregate> early = fold->Finish(base);
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("peer-0"));
  ASSERT_TRUE(fold->Offer(updates[2], base).ok());
  ASSERT_TRUE(fold->Offer(updates[0], base).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(fold->Offer(updates[0], base)));
  ASSERT_TRUE(fold->complete());
  absl::StatusOr<RoundAggregate> got = fold->Finish(base);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(got->model, want->model));
  EXPECT_EQ(got->included, want->included);
  EXPECT_THAT(got->included, ElementsAre("peer-0", "peer-1", "peer-2", "peer-3", "peer-5"));
  ASSERT_EQ(got->excluded.size(), 1u);
  EXPECT_EQ(got->excluded[0].peer_id, "peer-4");
  EXPECT_EQ(got->num_samples, want->num_samples);
}

TEST(RoundFoldTest, RefusesUpdatesItCannotTake) {
  const aggregation::Strategy mean = Make(common::v1::AGGREGATION_MEAN);
  const tensor::ModelLayout layout = Layout();
  const tensor::FlatModel base = Filled(layout, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(RoundFold::Start(mean, layout, {}, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(RoundFold::Start(mean, layout, {"a", "a"}, 0).status()));
  absl::StatusOr<RoundFold> fold = RoundFold::Start(mean, layout, {"b", "a"}, 0);
  ASSERT_TRUE(fold.ok()) << fold.status();
  EXPECT_THAT(fold->participants(), ElementsAre("a", "b"));
  absl::Status s = fold->Offer(PeerUpdate{"z", 1, Trained(base, 1)}, base);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("not a participant"));
  ASSERT_TRUE(fold->Offer(PeerUpdate{"b", 1, Trained(base, 2)}, base).ok());
  s = fold->Offer(PeerUpdate{"b", 1, Trained(base, 3)}, base);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("two updates"));
  EXPECT_TRUE(absl::IsInvalidArgument(fold->Offer(PeerUpdate{"a", 1, nullptr}, base)));
  EXPECT_FALSE(fold->complete());
}

// The next round's fold, restarted from the last one to keep its buffers, makes what a fresh
// fold makes, bit for bit: for mean (float and exact sums) and a strategy that keeps every
// delta, with an update left out for its norm and, with float sums, one held while it waits for
// a lower id.
TEST(RoundFoldTest, ARestartedFoldMakesWhatAFreshOneMakes) {
  const tensor::ModelLayout layout = Layout({32, 17});
  for (const aggregation::Strategy& strategy :
       {Make(common::v1::AGGREGATION_MEAN), ExactMean(), Make(common::v1::AGGREGATION_MEDIAN)}) {
    SCOPED_TRACE(strategy.name());
    const tensor::FlatModel first_base = Filled(layout, 0.25f);
    absl::StatusOr<RoundFold> fold = RoundFold::Start(strategy, layout, {"p1", "p2", "p3"}, 5.0);
    ASSERT_TRUE(fold.ok()) << fold.status();
    for (int i = 1; i <= 3; ++i) {
      ASSERT_TRUE(fold->Offer(PeerUpdate{absl::StrCat("p", i), 10,
                                         Trained(first_base, static_cast<uint32_t>(i))},
                              first_base)
                      .ok());
    }
    ASSERT_TRUE(fold->Finish(first_base).ok());

    const tensor::FlatModel base = Filled(layout, -0.5f);
    std::vector<PeerUpdate> updates = {
        PeerUpdate{"q1", 7, Trained(base, 11)}, PeerUpdate{"q2", 9, Trained(base, 12)},
        PeerUpdate{"q3", 11, Trained(base, 13, 1.0f)},  // norm about 24: left out
        PeerUpdate{"q4", 13, Trained(base, 14)}};
    absl::StatusOr<RoundAggregate> want = AggregateRound(strategy, base, updates, 5.0);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(want->excluded.size(), 1u);

    EXPECT_TRUE(absl::IsInvalidArgument(fold->Restart({"q1", "q1"})));
    EXPECT_THAT(fold->participants(), ElementsAre("p1", "p2", "p3"));
    ASSERT_TRUE(fold->Restart({"q4", "q3", "q2", "q1"}).ok());
    EXPECT_THAT(fold->participants(), ElementsAre("q1", "q2", "q3", "q4"));
    EXPECT_FALSE(fold->Has("p1"));
    ASSERT_TRUE(fold->Offer(updates[1], base).ok());
    EXPECT_EQ(fold->waiting(), fold->any_order() ? 0u : 1u);
    ASSERT_TRUE(fold->Offer(updates[0], base).ok());
    ASSERT_TRUE(fold->Offer(updates[3], base).ok());
    ASSERT_TRUE(fold->Offer(updates[2], base).ok());
    absl::StatusOr<RoundAggregate> got = fold->Finish(base);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameBytes(got->model, want->model));
    EXPECT_EQ(got->included, want->included);
    EXPECT_EQ(got->excluded.size(), 1u);
    EXPECT_EQ(got->num_samples, want->num_samples);
  }
}

}  // namespace
}  // namespace shoal::peer
