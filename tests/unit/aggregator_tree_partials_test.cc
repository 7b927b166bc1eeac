// TreePartials on its own: which children's partial sums a round takes, what a refused one is
// answered and the partial sum a child's round makes for its parent.

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/sessions/partial_sums.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PartialMeta Meta(const std::string& child, std::vector<std::string> contributors) {
  PartialMeta meta;
  meta.task = "t";
  meta.round = 3;
  meta.child = child;
  meta.base_version = 7;
  meta.num_samples = 10 * contributors.size();
  meta.loss_sum = 1.5;
  meta.contributors = std::move(contributors);
  return meta;
}

aggregation::PartialSum Sum(size_t count) {
  aggregation::PartialSum sum;
  sum.count = count;
  sum.sum = {1, 2};
  sum.total_weight = static_cast<double>(count);
  return sum;
}

TreePartials Tree(std::vector<std::string> children) {
  OpenRoundParams params;
  params.task = "t";
  params.round = 3;
  params.expected_children = std::move(children);
  absl::StatusOr<TreePartials> tree = TreePartials::Make(params, {"p"}, {}, "round 3");
  EXPECT_TRUE(tree.ok()) << tree.status();
  return *std::move(tree);
}

TreePartials::Round Open(std::set<std::string> peers) {
  TreePartials::Round round;
  round.number = 3;
  round.open = true;
  round.base_version = 7;
  round.has_peer = [peers](const std::string& peer) { return peers.count(peer) > 0; };
  return round;
}

// Admit's answer: "taken", "repeat" or the error's message.
std::string Answer(const absl::StatusOr<bool>& admitted) {
  if (!admitted.ok()) return std::string(admitted.status().message());
  return *admitted ? "repeat" : "taken";
}

TEST(TreePartialsTest, MakeRefusesAChildThatIsAPeerOrABackupOfNoChild) {
  OpenRoundParams params;
  params.expected_children = {"c", "p"};
  EXPECT_EQ(TreePartials::Make(params, {"p"}, {}, "r").status().code(),
            absl::StatusCode::kInvalidArgument);
  params.expected_children = {"c"};
  params.child_backups = {{"d", "b"}};
  absl::Status backup = TreePartials::Make(params, {"p"}, {}, "r").status();
  EXPECT_EQ(backup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(backup.message(), HasSubstr("child_backups names 'd'"));
}

TEST(TreePartialsTest, CheckSumWantsOneDistinctContributorPerTerm) {
  EXPECT_TRUE(TreePartials::CheckSum(Meta("c", {"a", "b"}), Sum(2)).ok());
  EXPECT_THAT(TreePartials::CheckSum(Meta("c", {"a", "b"}), Sum(3)).status().message(),
              HasSubstr("names 2 contributors for a sum of 3"));
  EXPECT_THAT(TreePartials::CheckSum(Meta("c", {"a", "a"}), Sum(2)).status().message(),
              HasSubstr("names a contributor twice"));
  PartialMeta few = Meta("c", {"a", "b"});
  few.num_samples = 1;
  EXPECT_EQ(TreePartials::CheckSum(few, Sum(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TreePartialsTest, AdmitsAnExpectedChildOnceAndRefusesTheRest) {
  TreePartials tree = Tree({"c", "d"});
  const PartialMeta meta = Meta("c", {"a"});
  EXPECT_EQ(Answer(tree.Admit(meta, {"a"}, Open({"p"}))), "taken");
  EXPECT_EQ(Answer(tree.Admit(meta, {"a"}, Open({"p"}))), "repeat");
  EXPECT_EQ(Answer(tree.Admit(Meta("x", {"b"}), {"b"}, Open({"p"}))),
            "child 'x' is not expected in round 3 of task 't'");
  EXPECT_EQ(Answer(tree.Admit(Meta("d", {"p"}), {"p"}, Open({"p"}))),
            "child 'd''s contributor 'p' is a peer of round 3 of task 't' already");
  TreePartials::Round closed = Open({});
  closed.open = false;
  EXPECT_EQ(tree.Admit(Meta("d", {"b"}), {"b"}, closed).status().code(),
            absl::StatusCode::kFailedPrecondition);
  TreePartials::Round other_base = Open({});
  other_base.base_version = 8;
  EXPECT_THAT(Answer(tree.Admit(Meta("d", {"b"}), {"b"}, other_base)),
              HasSubstr("summed updates of version 7"));
}

TEST(TreePartialsTest, ARefusedSumLetsTheChildTryAgain) {
  TreePartials tree = Tree({"c"});
  const PartialMeta meta = Meta("c", {"a"});
  ASSERT_EQ(Answer(tree.Admit(meta, {"a"}, Open({}))), "taken");
  absl::Status refused = tree.Refuse(meta, absl::OutOfRangeError("3 values, not 2"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "child 'c''s partial sum for round 3 of task 't': 3 values, not 2");
  EXPECT_EQ(tree.Refuse(meta, absl::FailedPreconditionError("x")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Answer(tree.Admit(meta, {"a"}, Open({}))), "taken");  // not a repeat: it may retry
}

TEST(TreePartialsTest, FinishKeepsTheRoundsPartialSum) {
  TreePartials tree = Tree({});
  EXPECT_EQ(tree.made(), nullptr);
  EXPECT_FALSE(tree.child_round());
  std::shared_ptr<const PartialResult> made = tree.Finish("t", 3, 7, {"a", "b"}, 20, 2.5, Sum(2));
  ASSERT_EQ(tree.made(), made);
  EXPECT_EQ(made->meta.round, 3u);
  EXPECT_EQ(made->meta.base_version, 7u);
  EXPECT_THAT(made->meta.contributors, ElementsAre("a", "b"));
  EXPECT_EQ(made->meta.num_samples, 20u);
  EXPECT_EQ(made->sum.count, 2u);
}

}  // namespace
}  // namespace shoal::aggregator
