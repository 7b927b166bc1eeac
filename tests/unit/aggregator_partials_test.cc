// Tree rounds at the aggregator core: children close their rounds into partial sums
// (ClosePartial), a parent adds them (AddPartial) and publishes what one flat round over the
// same updates would: bit-identical with exact_sum, within float rounding without it.

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/aggregator_core_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One aggregator of a tree: its core, with its own metrics.
struct Node {
  explicit Node(const Clock& clock) : metrics(registry) {
    auto made = AggregatorCore::Create(AggregatorCoreOptions{}, clock, metrics);
    EXPECT_TRUE(made.ok()) << made.status();
    core = *std::move(made);
  }
  prometheus::Registry registry;
  AggregatorMetrics metrics;
  std::unique_ptr<AggregatorCore> core;
};

tensor::FlatModel Base() {
  return Filled([](size_t i) { return 0.1f * static_cast<float>(i); });
}

// Peer k's delta: mixed magnitudes, so that float sums in different groupings differ.
tensor::FlatModel Delta(int k) {
  return Filled([k](size_t i) {
    return std::pow(10.0f, static_cast<float>(k % 4) - 2.0f) *
           std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(k));
  });
}

class AggregatorPartialsTest : public AggregatorCoreFixture {
 protected:
  std::unique_ptr<Node> NewNode() {
    auto node = std::make_unique<Node>(clock_);
    EXPECT_TRUE(node->core->PutModel("t", 0, Base()).ok());
    return node;
  }
  static v1::AggregationSettings Mean(bool exact) {
    common::v1::AggregationOptions options;
    if (exact) options.set_exact_sum(true);
    return StrategySettings(common::v1::AGGREGATION_MEAN, options);
  }
  static absl::Status OpenOn(AggregatorCore& core, std::vector<std::string> peers,
                             std::vector<std::string> children, v1::AggregationSettings settings) {
    OpenRoundParams p{"t", 1, 0, std::move(peers)};
    p.aggregation = std::move(settings);
    p.expected_children = std::move(children);
    return core.OpenRound(p);
  }
  static absl::Status PushTo(AggregatorCore& core, int k) {
    auto push = core.BeginPush(
        PushMeta{"t", 1, absl::StrCat("p", k), 0, static_cast<uint64_t>(100 + 37 * k), 0.25 * k});
    if (!push.ok()) return push.status();
    if (*push == nullptr) return absl::AlreadyExistsError("duplicate");  // accepted before
    const tensor::FlatModel delta = Delta(k);  // the encoder reads it in place
    tensor::FrameEncoder enc(delta, 16);
    common::v1::TensorFrame f;
    while (enc.Next(&f)) {
      if (absl::Status s = (*push)->AddFrame(f); !s.ok()) return s;
    }
    return (*push)->Commit();
  }
  // The child's partial, sent to `parent` as child `id`.
  static absl::StatusOr<bool> Forward(AggregatorCore& child, const std::string& id,
                                      AggregatorCore& parent) {
    auto partial = child.ClosePartial("t", 1);
    if (!partial.ok()) return partial.status();
    PartialMeta meta = (*partial)->meta;
    meta.child = id;
    return parent.AddPartial(meta, (*partial)->sum);
  }
  // One flat round of `settings` over `peers`: its model minus the base.
  std::vector<float> RunFlat(const std::vector<int>& peers,
                             const v1::AggregationSettings& settings) {
    auto flat = NewNode();
    std::vector<std::string> ids;
    for (int k : peers) ids.push_back(absl::StrCat("p", k));
    EXPECT_TRUE(OpenOn(*flat->core, ids, {}, settings).ok());
    for (int k : peers) EXPECT_TRUE(PushTo(*flat->core, k).ok());
    EXPECT_TRUE(flat->core->CloseRound("t", 1).ok());
    std::vector<float> delta = flat->core->GetModel("t", 1)->model->values;
    const tensor::FlatModel base = Base();
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= base.values[i];
    return delta;
  }
  // One flat round over peers 0..n-1 pushed in reverse.
  RoundResult Flat(int n, bool exact, tensor::FlatModel* model) {
    auto flat = NewNode();
    std::vector<std::string> peers;
    for (int k = 0; k < n; ++k) peers.push_back(absl::StrCat("p", k));
    EXPECT_TRUE(OpenOn(*flat->core, peers, {}, Mean(exact)).ok());
    for (int k = n - 1; k >= 0; --k) EXPECT_TRUE(PushTo(*flat->core, k).ok());
    auto result = flat->core->CloseRound("t", 1);
    EXPECT_TRUE(result.ok()) << result.status();
    *model = *flat->core->GetModel("t", 1)->model;
    return *result;
  }
  // Peers 0..2 push to leaf a, 3..5 to leaf b, 6 straight to the root; a and b forward.
  RoundResult Tree(bool exact, tensor::FlatModel* model) {
    auto root = NewNode(), a = NewNode(), b = NewNode();
    EXPECT_TRUE(OpenOn(*root->core, {"p6"}, {"a", "b"}, Mean(exact)).ok());
    EXPECT_TRUE(OpenOn(*a->core, {"p0", "p1", "p2"}, {}, Mean(exact)).ok());
    EXPECT_TRUE(OpenOn(*b->core, {"p3", "p4", "p5"}, {}, Mean(exact)).ok());
    for (int k : {0, 1, 2}) EXPECT_TRUE(PushTo(*a->core, k).ok());
    for (int k : {5, 3, 4}) EXPECT_TRUE(PushTo(*b->core, k).ok());
    EXPECT_THAT(Forward(*b->core, "b", *root->core), absl::StatusOr<bool>(false));
    EXPECT_TRUE(PushTo(*root->core, 6).ok());
    EXPECT_THAT(Forward(*a->core, "a", *root->core), absl::StatusOr<bool>(false));
    auto result = root->core->CloseRound("t", 1);
    EXPECT_TRUE(result.ok()) << result.status();
    *model = *root->core->GetModel("t", 1)->model;
    return *result;
  }
};

TEST_F(AggregatorPartialsTest, ExactTreeRoundPublishesTheFlatRoundsModelToTheBit) {
  tensor::FlatModel flat, tree;
  RoundResult f = Flat(7, true, &flat);
  RoundResult t = Tree(true, &tree);
  EXPECT_EQ(t.digest, f.digest);
  EXPECT_EQ(tree.values, flat.values);
  EXPECT_EQ(t.contributors, f.contributors);
  EXPECT_EQ(t.contributors.size(), 7u);
  EXPECT_EQ(t.num_samples, f.num_samples);
  EXPECT_DOUBLE_EQ(t.mean_train_loss, f.mean_train_loss);
  EXPECT_EQ(t.version, 1u);
}

TEST_F(AggregatorPartialsTest, FloatTreeRoundIsTheFlatRoundWithinFloatRounding) {
  tensor::FlatModel flat, tree;
  Flat(7, false, &flat);
  RoundResult t = Tree(false, &tree);
  EXPECT_EQ(t.contributors.size(), 7u);
  for (size_t i = 0; i < flat.values.size(); ++i) {
    EXPECT_NEAR(tree.values[i], flat.values[i], 1e-6f + 1e-6f * std::fabs(flat.values[i])) << i;
  }
}

TEST_F(AggregatorPartialsTest, RepeatsAreIdempotent) {
  auto root = NewNode(), a = NewNode();
  ASSERT_TRUE(OpenOn(*root->core, {}, {"a"}, Mean(true)).ok());
  ASSERT_TRUE(OpenOn(*a->core, {"p0", "p1", "p2"}, {}, Mean(true)).ok());
  ASSERT_TRUE(PushTo(*a->core, 0).ok());
  ASSERT_TRUE(PushTo(*a->core, 1).ok());
  auto first = a->core->ClosePartial("t", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = a->core->ClosePartial("t", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->get(), again->get());
  EXPECT_THAT((*first)->meta.contributors, ElementsAre("p0", "p1"));
  EXPECT_EQ((*first)->meta.num_samples, 100u + 137u);
  // The child's round is closed for pushes, and it published nothing.
  EXPECT_EQ(PushTo(*a->core, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PushTo(*a->core, 0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a->core->GetModel("t", std::nullopt)->version, 0u);
  EXPECT_EQ(a->core->CloseRound("t", 1).status().code(), absl::StatusCode::kFailedPrecondition);

  PartialMeta meta = (*first)->meta;
  meta.child = "a";
  EXPECT_THAT(root->core->AddPartial(meta, (*first)->sum), absl::StatusOr<bool>(false));
  EXPECT_THAT(root->core->AddPartial(meta, (*first)->sum), absl::StatusOr<bool>(true));
  auto closed = root->core->CloseRound("t", 1);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->num_samples, 237u);
  EXPECT_THAT(closed->contributors, ElementsAre("p0", "p1"));
}

TEST_F(AggregatorPartialsTest, BadPartialsAreRefusedAndAddNothing) {
  auto root = NewNode(), a = NewNode(), flt = NewNode();
  ASSERT_TRUE(OpenOn(*root->core, {"p9"}, {"a"}, Mean(true)).ok());
  ASSERT_TRUE(OpenOn(*a->core, {"p0", "p1"}, {}, Mean(true)).ok());
  ASSERT_TRUE(OpenOn(*flt->core, {"p0", "p1"}, {}, Mean(false)).ok());
  for (AggregatorCore* c : {a->core.get(), flt->core.get()}) {
    ASSERT_TRUE(PushTo(*c, 0).ok());
    ASSERT_TRUE(PushTo(*c, 1).ok());
  }
  auto partial = a->core->ClosePartial("t", 1);
  ASSERT_TRUE(partial.ok());
  const PartialMeta good = [&] {
    PartialMeta m = (*partial)->meta;
    m.child = "a";
    return m;
  }();
  const aggregation::PartialSum& sum = (*partial)->sum;

  PartialMeta m = good;
  m.child = "z";
  absl::StatusOr<bool> r = root->core->AddPartial(m, sum);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("child 'z' is not expected in round 1"));

  m = good;
  m.round = 2;
  EXPECT_EQ(root->core->AddPartial(m, sum).status().code(), absl::StatusCode::kFailedPrecondition);

  m = good;
  m.base_version = 3;
  EXPECT_THAT(root->core->AddPartial(m, sum).status().message(), HasSubstr("version 3"));

  m = good;
  m.contributors = {"p0", "p9"};  // p9 is the root's own peer
  r = root->core->AddPartial(m, sum);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("'p9' is a peer of round 1"));

  m = good;
  m.loss_sum = std::nan("");
  EXPECT_THAT(root->core->AddPartial(m, sum).status().message(), HasSubstr("not finite"));

  m = good;
  m.num_samples = 1;  // two contributors train at least a sample each
  EXPECT_EQ(root->core->AddPartial(m, sum).status().code(), absl::StatusCode::kInvalidArgument);

  m = good;
  m.contributors = {"p0"};
  EXPECT_EQ(root->core->AddPartial(m, sum).status().code(), absl::StatusCode::kInvalidArgument);

  auto float_partial = flt->core->ClosePartial("t", 1);
  ASSERT_TRUE(float_partial.ok());
  r = root->core->AddPartial(good, (*float_partial)->sum);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("the partial sum is float; this sum is exact"));

  aggregation::PartialSum huge = sum;
  huge.exact[3] = static_cast<aggregation::ExactValue>(1) << 120;
  r = root->core->AddPartial(good, huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("tensor 'conv.weight' element 3"));

  // None of that counted: the good partial goes in, and the round holds exactly it.
  EXPECT_THAT(root->core->AddPartial(good, sum), absl::StatusOr<bool>(false));
  auto closed = root->core->CloseRound("t", 1);
  ASSERT_TRUE(closed.ok());
  EXPECT_THAT(closed->contributors, ElementsAre("p0", "p1"));
  EXPECT_EQ(closed->num_samples, 237u);
}

TEST_F(AggregatorPartialsTest, RobustStrategiesRunPerClusterWeightedBySamples) {
  const v1::AggregationSettings median = StrategySettings(common::v1::AGGREGATION_MEDIAN);
  auto root = NewNode(), a = NewNode(), b = NewNode(), idle = NewNode();
  ASSERT_TRUE(OpenOn(*root->core, {"p6"}, {"a", "b", "idle"}, median).ok());
  ASSERT_TRUE(OpenOn(*a->core, {"p0", "p1", "p2"}, {}, median).ok());
  ASSERT_TRUE(OpenOn(*b->core, {"p3", "p4", "p5"}, {}, median).ok());
  // A cluster none of whose peers pushed sends an empty sum, which adds nothing.
  ASSERT_TRUE(OpenOn(*idle->core, {"p8"}, {}, median).ok());
  EXPECT_THAT(Forward(*idle->core, "idle", *root->core), absl::StatusOr<bool>(false));
  for (int k : {0, 1, 2}) ASSERT_TRUE(PushTo(*a->core, k).ok());
  for (int k : {5, 3, 4}) ASSERT_TRUE(PushTo(*b->core, k).ok());
  ASSERT_TRUE(PushTo(*root->core, 6).ok());
  // An exact partial sum has no place in a median round.
  {
    auto exact = NewNode();
    ASSERT_TRUE(OpenOn(*exact->core, {"p7"}, {}, Mean(true)).ok());
    ASSERT_TRUE(PushTo(*exact->core, 7).ok());
    absl::StatusOr<bool> r = Forward(*exact->core, "a", *root->core);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("exact_sum is for mean"));
  }
  EXPECT_THAT(Forward(*a->core, "a", *root->core), absl::StatusOr<bool>(false));
  EXPECT_THAT(Forward(*b->core, "b", *root->core), absl::StatusOr<bool>(false));
  auto result = root->core->CloseRound("t", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->contributors.size(), 7u);
  const tensor::FlatModel tree = *root->core->GetModel("t", 1)->model;

  // Each cluster's median (a flat median round over its peers), weighted by its samples.
  auto samples = [](int k) { return 100.0 + 37.0 * k; };
  const std::vector<std::vector<int>> clusters = {{0, 1, 2}, {3, 4, 5}, {6}};
  std::vector<double> sum(tree.values.size(), 0.0);
  double weight = 0;
  for (const std::vector<int>& cluster : clusters) {
    const std::vector<float> delta = RunFlat(cluster, median);
    double w = 0;
    for (int k : cluster) w += samples(k);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w * delta[i];
    weight += w;
  }
  const tensor::FlatModel base = Base();
  for (size_t i = 0; i < sum.size(); ++i) {
    const double expected = base.values[i] + sum[i] / weight;
    EXPECT_NEAR(tree.values[i], expected, 1e-5 + 1e-5 * std::fabs(expected)) << i;
  }
}

TEST_F(AggregatorPartialsTest, ChildrenMayReadTheTasksModelsButNothingMore) {
  auto root = NewNode();
  ASSERT_TRUE(OpenOn(*root->core, {"p0"}, {"leaf-a"}, Mean(false)).ok());
  root->core->SetMembers("t", {{"p0", "token-0"}});
  EXPECT_TRUE(root->core->CheckReader("t", "leaf-a", "", "leaf-a").ok());
  EXPECT_TRUE(root->core->CheckReader("t", "p0", "token-0", "p0").ok());
  EXPECT_EQ(root->core->CheckReader("t", "leaf-a", "", "leaf-b").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(root->core->CheckReader("t", "leaf-z", "", "leaf-z").code(),
            absl::StatusCode::kUnauthenticated);
  // Uploads are a member's: a child has no session token.
  EXPECT_EQ(root->core->CheckCaller("t", "leaf-a", "", "leaf-a").code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AggregatorPartialCallerTest, OnlyTheChildOrTheCoordinatorMayPushItsPartial) {
  EXPECT_TRUE(AggregatorCore::CheckPartialCaller("aggregator-1", "").ok());  // plaintext
  EXPECT_TRUE(AggregatorCore::CheckPartialCaller("aggregator-1", "aggregator-1").ok());
  EXPECT_TRUE(AggregatorCore::CheckPartialCaller("aggregator-1", "coordinator").ok());
  absl::Status s = AggregatorCore::CheckPartialCaller("aggregator-1", "peer-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("'peer-0' may not push child 'aggregator-1'"));
}

// Aggregators sharing one certificate (deploy/k8s) are children "NAME@ADDRESS".
TEST(AggregatorPartialCallerTest, ASharedCertificateNamesChildrenByAddress) {
  EXPECT_TRUE(AggregatorCore::CheckPartialCaller("aggregator@10.0.0.7:7100", "aggregator").ok());
  EXPECT_FALSE(AggregatorCore::CheckPartialCaller("aggregator@10.0.0.7:7100", "aggregat").ok());
  EXPECT_FALSE(AggregatorCore::CheckPartialCaller("aggregatorX@1:2", "aggregator").ok());
  EXPECT_FALSE(AggregatorCore::CheckPartialCaller("aggregator@", "aggregator").ok());
  EXPECT_TRUE(IsChildOf("aggregator", "aggregator"));
  EXPECT_FALSE(IsChildOf("peer-0", "aggregator@1:2"));
}

}  // namespace
}  // namespace shoal::aggregator
