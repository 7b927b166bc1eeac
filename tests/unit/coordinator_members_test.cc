// How the coordinator keeps a task's aggregator told of its members (SetMembers) when peers
// join faster than the aggregator answers: one call at a time, the changes made meanwhile in
// the next, and each event held until the call that carries its peer's session token is
// answered. With thousands of peers, a call per join made joins quadratic
// (docs/explanation/federated-sync.md, "Rules of a round").

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator {
namespace {

using core_testing::CoordinatorCoreTest;
using core_testing::Spec;
using ::testing::ElementsAre;

std::set<std::string> Members(const aggregator::v1::SetMembersRequest& request) {
  std::set<std::string> ids;
  for (const auto& [id, token] : request.session_tokens()) ids.insert(id);
  return ids;
}

TEST_F(CoordinatorCoreTest, JoinsWhileSetMembersIsInFlightGoInOneNextCall) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 3, 1)).ok());
  RunWork();
  const size_t before = aggregator_.members.size();
  auto a = Join("a");  // SetMembers {a} is sent (queued on the calls executor, not answered)
  auto b = Join("b");
  auto c = Join("c");  // b and c wait for {a} to be answered
  EXPECT_EQ(aggregator_.members.size(), before) << "nothing has run yet";
  EXPECT_EQ(calls_.pending(), 1u) << "one SetMembers in flight, not one per join";
  calls_.RunAll();  // {a} is answered, which sends {a, b, c}; RunAll runs that one too
  ASSERT_EQ(aggregator_.members.size(), before + 2);
  EXPECT_EQ(Members(aggregator_.members[before]), (std::set<std::string>{"a"}));
  EXPECT_EQ(Members(aggregator_.members[before + 1]), (std::set<std::string>{"a", "b", "c"}));
}

// Three peers make the task look for its initial model: the event asking one of them waits for
// the call that carries all three tokens, and goes out once that call is answered.
TEST_F(CoordinatorCoreTest, EventsWaitForTheMembershipTheyNeed) {
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  ASSERT_TRUE(core_->CreateTask(Spec("t", 3, 1)).ok());
  RunWork();
  auto a = Join("a");
  auto b = Join("b");
  auto c = Join("c");
  for (int i = 0; i < 5; ++i) Step();
  std::vector<v1::CoordinatorEvent::KindCase> asked;
  for (auto* sink : {a.get(), b.get(), c.get()}) {
    for (auto kind : sink->Take()) {
      if (kind == v1::CoordinatorEvent::kInitializeModel) asked.push_back(kind);
    }
  }
  EXPECT_THAT(asked, ElementsAre(v1::CoordinatorEvent::kInitializeModel));
  EXPECT_EQ(Members(aggregator_.members.back()), (std::set<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace shoal::coordinator
