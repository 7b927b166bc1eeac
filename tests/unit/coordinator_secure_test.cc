// Secure aggregation in the coordinator (federated-sync): the peers' identity keys from their
// Hellos go to the aggregator in OpenRound and to every expected peer in RoundStarted, a peer
// without one is left out of the rounds, and a round whose secure aggregation failed
// (FAILED_PRECONDITION at the close) runs again with the same number.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/unit/coordinator_core_fixture.h"

namespace shoal::coordinator::core_testing {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

common::v1::TaskSpec SecureSpec() {
  common::v1::TaskSpec spec = Spec("t", 3, 2);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(1.5);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_threshold(2);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_neighbourhood_size(2);
  return spec;
}

class CoordinatorSecureTest : public CoordinatorCoreTest {
 protected:
  // Peer `name` joins with identity key "key-<name>" (none when `key` is false).
  std::shared_ptr<FakeSink> JoinWithKey(const std::string& name, bool key = true) {
    auto sink = std::make_shared<FakeSink>();
    v1::Hello hello = Hello(name);
    if (key) hello.set_identity_public_key("key-" + name);
    auto id = core_->Connect(hello, /*identity=*/"", sink);
    EXPECT_TRUE(id.ok()) << id.status();
    return sink;
  }
  // The identity keys of the last RoundStarted `sink` got, and its round.
  static std::map<std::string, std::string> LastKeys(const FakeSink& sink, uint64_t& round) {
    std::map<std::string, std::string> keys;
    for (const auto& e : sink.events) {
      if (!e.has_round_started()) continue;
      round = e.round_started().round();
      keys = {e.round_started().identity_keys().begin(), e.round_started().identity_keys().end()};
    }
    return keys;
  }
  void Start(const std::vector<std::string>& peers) {
    ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
    auto created = core_->CreateTask(SecureSpec());
    ASSERT_TRUE(created.ok()) << created.status();
    for (const std::string& p : peers) sinks_[p] = JoinWithKey(p, p != "old");
    Step();
    ASSERT_TRUE(core_->OnMessage(peers.front(), Initialized("t")).ok());
    Step();
  }
  std::map<std::string, std::shared_ptr<FakeSink>> sinks_;
};

TEST_F(CoordinatorSecureTest, IdentityKeysGoToTheAggregatorAndToEveryPeer) {
  Start({"a", "b", "c", "old"});
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  const aggregator::v1::OpenRoundRequest& open = aggregator_.opened[0];
  EXPECT_THAT(Ids(open.expected_peers()), ElementsAre("a", "b", "c"));  // "old" has no key
  EXPECT_TRUE(open.secure_aggregation().enabled());
  EXPECT_DOUBLE_EQ(open.secure_aggregation().clip_norm(), 1.5);
  EXPECT_EQ(open.secure_aggregation().threshold(), 2u);
  EXPECT_EQ(open.secure_aggregation().neighbourhood_size(), 2u);
  EXPECT_THAT(open.secure_aggregation().identity_keys(),
              UnorderedElementsAre(Pair("a", "key-a"), Pair("b", "key-b"), Pair("c", "key-c")));
  for (const std::string p : {"a", "b", "c"}) {
    uint64_t round = 0;
    EXPECT_THAT(LastKeys(*sinks_[p], round),
                ElementsAre(Pair("a", "key-a"), Pair("b", "key-b"), Pair("c", "key-c")))
        << p;
    EXPECT_EQ(round, 1u) << p;
  }
  uint64_t round = 0;
  EXPECT_TRUE(LastKeys(*sinks_["old"], round).empty());
}

TEST_F(CoordinatorSecureTest, ARoundWhoseSecureAggregationFailedRunsAgain) {
  Start({"a", "b", "c"});
  ASSERT_EQ(aggregator_.opened.size(), 1u);
  aggregator_.close_status =
      absl::FailedPreconditionError("round 1 of task 't': secure aggregation failed");
  for (const std::string p : {"a", "b", "c"}) Accept("t", 1, p);
  Step();
  ASSERT_EQ(aggregator_.closed.size(), 1u);
  ASSERT_EQ(aggregator_.opened.size(), 2u);
  EXPECT_EQ(aggregator_.opened[1].round(), 1u);  // the same round, again
  EXPECT_EQ(aggregator_.opened[1].base_version(), aggregator_.opened[0].base_version());
  uint64_t round = 0;
  LastKeys(*sinks_["a"], round);
  EXPECT_EQ(round, 1u);
  v1::TaskStatus status = Status("t");
  EXPECT_EQ(status.round(), 1u);
  EXPECT_EQ(status.phase(), v1::ROUND_PHASE_TRAINING);
  EXPECT_EQ(status.history_size(), 0);

  aggregator_.close_status = absl::OkStatus();
  aggregator_.contributors = {"a", "b", "c"};
  for (const std::string p : {"a", "b", "c"}) Accept("t", 1, p);
  Step();
  status = Status("t");
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).round(), 1u);
  EXPECT_EQ(status.history(0).participants_size(), 3);
}

}  // namespace
}  // namespace shoal::coordinator::core_testing
