// Federation statistics (normalization standardize without the task's mean/std): the
// coordinator adds up the peers' DataMoments once min_participants present peers have sent
// theirs, fixes the mean and std in TaskStatus.statistics for good, tells every peer, gives later
// peers the same, and keeps them across a restart. Fake clock, fake aggregator, real SQLite store.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/federation_statistics.h"
#include "tests/unit/coordinator_core_fixture.h"
#include "tests/unit/statistics_testing.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace ::shoal::coordinator::core_testing;  // NOLINT: the fixture's fakes and helpers
using statistics_testing::CsvStandardize;
using statistics_testing::PlainMoments;

common::v1::TaskSpec CsvSpec(const std::string& name, uint32_t min) {
  return CsvStandardize(Spec(name, min, 5));
}

v1::PeerMessage Moments(const std::string& task, uint64_t count, std::vector<double> sum,
                        std::vector<double> sum_squares) {
  return PlainMoments(task,
                      statistics_testing::Moments(count, std::move(sum), std::move(sum_squares)));
}

v1::PeerMessage MomentsOfA(const std::string& task) {
  return PlainMoments(task, statistics_testing::MomentsOfA());
}
v1::PeerMessage MomentsOfB(const std::string& task) {
  return PlainMoments(task, statistics_testing::MomentsOfB());
}

std::vector<const v1::CoordinatorEvent*> StatisticsEvents(const FakeSink& sink) {
  std::vector<const v1::CoordinatorEvent*> out;
  for (const auto& e : sink.events) {
    if (e.has_statistics()) out.push_back(&e);
  }
  return out;
}

void ExpectPooledStatistics(const common::v1::FederationStatistics& s) {
  ASSERT_EQ(s.mean_size(), 2);
  ASSERT_EQ(s.std_size(), 2);
  EXPECT_DOUBLE_EQ(s.mean(0), 4.0);
  EXPECT_DOUBLE_EQ(s.mean(1), 10.0);
  EXPECT_NEAR(s.std(0), std::sqrt(26.0 / 3.0), 1e-12);  // ((1-4)^2 + (3-4)^2 + (8-4)^2) / 3
  EXPECT_EQ(s.std(1), 1.0);
  EXPECT_EQ(s.samples(), 3u);
  EXPECT_THAT(s.peers(), ElementsAre("a", "b"));
}

TEST_F(CoordinatorCoreTest, FederationStatisticsAreFixedOnceForEveryPeerAndSurviveARestart) {
  auto sinks = StartTask(CsvSpec("t", 2), {"a", "b"});
  for (auto& [id, sink] : sinks) sink->events.clear();

  ASSERT_TRUE(core_->OnMessage("a", MomentsOfA("t")).ok());
  EXPECT_FALSE(Status("t").has_statistics()) << "one of two peers has sent its moments";
  EXPECT_TRUE(StatisticsEvents(*sinks["a"]).empty());
  ASSERT_TRUE(core_->OnMessage("b", MomentsOfB("t")).ok());
  const common::v1::FederationStatistics fixed = Status("t").statistics();
  ExpectPooledStatistics(fixed);
  for (const char* id : {"a", "b"}) {
    auto events = StatisticsEvents(*sinks[id]);
    ASSERT_EQ(events.size(), 1u) << id;
    EXPECT_EQ(events[0]->task(), "t");
    EXPECT_EQ(events[0]->statistics().SerializeAsString(), fixed.SerializeAsString());
  }

  // A later peer is assigned with them, and its own moments change nothing.
  auto c = Join("c");
  ASSERT_FALSE(c->events.empty());
  const v1::CoordinatorEvent& assigned = c->events.back();
  ASSERT_TRUE(assigned.has_task_assigned());
  EXPECT_EQ(assigned.task_assigned().statistics().SerializeAsString(), fixed.SerializeAsString());
  c->events.clear();
  ASSERT_TRUE(core_->OnMessage("c", Moments("t", 100, {1e4, 0}, {1e6, 0})).ok());
  ASSERT_EQ(StatisticsEvents(*c).size(), 1u);
  EXPECT_EQ(StatisticsEvents(*c)[0]->statistics().SerializeAsString(), fixed.SerializeAsString());
  EXPECT_EQ(Status("t").statistics().SerializeAsString(), fixed.SerializeAsString());

  Step();
  Recreate();  // a new coordinator process on the same state dir
  EXPECT_EQ(Status("t").statistics().SerializeAsString(), fixed.SerializeAsString());
  ASSERT_TRUE(core_->RegisterAggregator("127.0.0.1:5555").ok());
  Step();
  auto a = Join("a");
  ASSERT_FALSE(a->events.empty());
  ASSERT_TRUE(a->events.back().has_task_assigned());
  EXPECT_EQ(a->events.back().task_assigned().statistics().SerializeAsString(),
            fixed.SerializeAsString());
}

TEST_F(CoordinatorCoreTest, FederationStatisticsAddUpOnlyThePeersStillPresent) {
  auto sinks = StartTask(CsvSpec("t", 2), {"a", "x"});
  ASSERT_TRUE(core_->OnMessage("x", Moments("t", 5, {500, 500}, {5e4, 5e4})).ok());
  core_->Disconnect("x", sinks["x"].get());  // leaves before the statistics are fixed
  Step();
  ASSERT_TRUE(core_->OnMessage("a", MomentsOfA("t")).ok());
  EXPECT_FALSE(Status("t").has_statistics());
  auto b = Join("b");
  ASSERT_TRUE(core_->OnMessage("b", MomentsOfB("t")).ok());
  ExpectPooledStatistics(Status("t").statistics());
}

TEST_F(CoordinatorCoreTest, MalformedOrUnneededMomentsAreRefused) {
  auto sinks = StartTask(CsvSpec("t", 3), {"a", "b"});
  absl::Status s = core_->OnMessage("a", Moments("t", 0, {1}, {1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("count must be > 0"));
  s = core_->OnMessage("a", Moments("t", 2, {1, 2}, {1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 sums and 1 sums of squares"));
  s = core_->OnMessage("a", Moments("t", 2, {1, NAN}, {1, 1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(core_->OnMessage("a", MomentsOfA("t")).ok());
  s = core_->OnMessage("b", Moments("t", 2, {1, 2, 3}, {1, 2, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("3 features, but peer a has 2"));
}

// An image folder's moments are per channel: as many as the task's channels.
TEST_F(CoordinatorCoreTest, ImageFolderMomentsArePerChannel) {
  common::v1::TaskSpec spec = CsvSpec("i", 1);
  common::v1::DatasetSpec& d = *spec.mutable_dataset();
  d.clear_label_column();
  d.clear_num_classes();
  d.set_format(common::v1::DATA_FORMAT_IMAGE_FOLDER);
  d.set_train("train");
  d.add_classes("x");
  d.add_classes("y");
  d.add_image_size(8);
  d.set_channels(3);
  auto sinks = StartTask(spec, {"a"});
  absl::Status s = core_->OnMessage("a", MomentsOfA("i"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 features, but the task's dataset.channels is 3"));
  EXPECT_FALSE(Status("i").has_statistics());
  // Two images; sums per image (of the pixels, divided by the pixels per image).
  ASSERT_TRUE(core_->OnMessage("a", Moments("i", 2, {1, 0.5, 0}, {0.68, 0.25, 0})).ok());
  const common::v1::FederationStatistics fixed = Status("i").statistics();
  ASSERT_EQ(fixed.mean_size(), 3);
  ASSERT_EQ(fixed.std_size(), 3);
  EXPECT_THAT(fixed.mean(), ElementsAre(0.5, 0.25, 0));
  EXPECT_NEAR(fixed.std(0), 0.3, 1e-12);
  EXPECT_NEAR(fixed.std(1), 0.25, 1e-12);
  EXPECT_EQ(fixed.std(2), 1.0);  // a constant channel
  EXPECT_EQ(fixed.samples(), 2u);
}

// Fashion-MNIST (like explicit mean/std and standardize-local) needs no federation statistics.
TEST_F(CoordinatorCoreTest, MomentsForATaskThatNeedsNoStatisticsAreRefused) {
  auto sinks = StartTask(Spec("f", 1, 5), {"a"});
  absl::Status s = core_->OnMessage("a", MomentsOfA("f"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not standardise with the federation's statistics"));
  EXPECT_FALSE(Status("f").has_statistics());
}

TEST(AddUpStatisticsTest, PoolsEveryPeersMomentsAndNamesAMismatch) {
  std::map<std::string, data::FeatureMoments> by_peer;
  by_peer["b"] = statistics_testing::MomentsOfB();
  by_peer["a"] = statistics_testing::MomentsOfA();
  absl::StatusOr<common::v1::FederationStatistics> s =
      AddUpStatistics(by_peer, absl::FromUnixMillis(1234));
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectPooledStatistics(*s);
  EXPECT_EQ(s->fixed_unix_ms(), 1234);
  by_peer["c"] = {1, {1}, {1}};
  s = AddUpStatistics(by_peer, absl::FromUnixMillis(1234));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("peer c: moments: 1 features"));
}

}  // namespace
}  // namespace shoal::coordinator
