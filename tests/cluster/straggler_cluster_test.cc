// Stragglers with real processes on 127.0.0.1 (mutual TLS): three peers train a federated-sync
// task with straggler_factor 2; peer-2 trains 5x slower than the others (shoal-peer-testing
// --test-slow-batch: 125 ms a batch against 25). After two slow rounds it moves to asynchronous
// contribution: the rounds then keep the fast peers' pace, and its late updates still go in,
// none refused. The task runs until ten rounds are done and two of them took a late update (how
// many the straggler gets in over a fixed number of rounds depends on the machine's pace), then
// is stopped. The same on a tree (topology hierarchical, clusters of two under a root): a
// straggler pushes late to its own cluster's aggregator, which weighs it by staleness and
// forwards it in its sum.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-stragglers-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class StragglerClusterTest : public ::testing::TestWithParam<bool> {};  // hierarchical

TEST_P(StragglerClusterTest, ASlowPeerGoesAsyncAndItsUpdatesStillCount) {
  const bool hierarchical = GetParam();
  Cluster cluster(TempDir());
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  // A tree: a root and a cluster of two plus one of one.
  for (int i = 0; i < (hierarchical ? 3 : 1); ++i) {
    ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  }
  for (int i = 0; i < 3; ++i) {
    const int batch_ms = i == 2 ? 125 : 25;
    absl::Status started =
        cluster.StartTestPeer(i, 3, {absl::StrCat("--test-slow-batch=", batch_ms)});
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("stragglers");
  spec.set_rounds(40);  // a bound: the test stops the task once it has seen enough
  spec.set_min_participants(3);
  spec.set_straggler_factor(2);
  spec.set_straggler_rounds(2);
  if (hierarchical) {
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(2);
  }
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  if (hierarchical) {
    auto tree = cluster.WaitFor(
        spec.name(),
        [](const cv1::TaskStatus& s) { return s.round() >= 1 && s.clusters_size() == 3; },
        Cluster::TaskBound(spec), "a round on a root and two clusters");
    ASSERT_TRUE(tree.ok()) << tree.status();
  }
  auto late_rounds = [](const cv1::TaskStatus& s) {
    int n = 0;
    for (const cv1::RoundSummary& r : s.history()) n += r.late_size() > 0 ? 1 : 0;
    return n;
  };
  auto status = cluster.WaitFor(
      spec.name(),
      [&](const cv1::TaskStatus& s) {
        return (s.state() != cv1::TASK_STATE_WAITING && s.state() != cv1::TASK_STATE_RUNNING) ||
               (s.history_size() >= 10 && late_rounds(s) >= 2);
      },
      Cluster::TaskBound(spec), "ten rounds, two of them with a late update");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_RUNNING) << status->message();
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    cv1::StopTaskRequest request;
    request.set_name(spec.name());
    cv1::StopTaskResponse response;
    grpc::Status stopped = cluster.control().StopTask(&context, request, &response);
    ASSERT_TRUE(stopped.ok()) << stopped.error_message();
  }

  // The first two rounds waited for peer-2; then it went async (and stays: it never speeds up).
  EXPECT_THAT(status->async_peers(), ElementsAre("peer-2"));
  std::vector<int64_t> held, paced;
  int late = 0;
  for (const cv1::RoundSummary& r : status->history()) {
    EXPECT_EQ(r.dropped_size(), 0) << r.ShortDebugString();
    if (r.round() <= 2) {
      EXPECT_EQ(r.participants_size(), 3) << r.ShortDebugString();
      EXPECT_EQ(r.late_size(), 0) << r.ShortDebugString();
      held.push_back(r.duration_ms());
    } else {
      EXPECT_THAT(r.participants(), ::testing::IsSupersetOf({"peer-0", "peer-1"}));
      for (const std::string& id : r.late()) {
        EXPECT_EQ(id, "peer-2");
        ++late;
      }
      if (r.round() >= 5) paced.push_back(r.duration_ms());
    }
  }
  std::sort(paced.begin(), paced.end());
  const int64_t paced_median = paced[paced.size() / 2];
  const int64_t held_min = *std::min_element(held.begin(), held.end());
  std::printf(
      "[ figure ] %s: rounds held by the straggler: %lld ms at least; async: median %lld ms; "
      "its late updates in %d rounds\n",
      hierarchical ? "tree" : "flat", static_cast<long long>(held_min),
      static_cast<long long>(paced_median), late);
  // Rounds keep the fast peers' pace: well under the rounds that waited for peer-2.
  EXPECT_LT(paced_median * 10, held_min * 6);
  // Its updates count: late ones went in, and none was refused.
  EXPECT_GE(late, 2);
  const std::string log = ReadFile(cluster.dir() + "/peer-2.log");
  EXPECT_THAT(log, Not(HasSubstr("update not accepted")));
  EXPECT_THAT(log, Not(HasSubstr("update rejected")));
  EXPECT_THAT(ReadFile(cluster.dir() + "/coordinator.log"),
              HasSubstr("peer peer-2 moves to asynchronous contribution"));
}

INSTANTIATE_TEST_SUITE_P(Topologies, StragglerClusterTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Hierarchical" : "Flat";
                         });

}  // namespace
}  // namespace shoal::testing
