// How the coordinator ranks nodes to aggregate on (host_rank.h) and the pool's pick for a new
// task or cluster (AggregatorPool::Pick): the well connected first, then by compute; a free node
// replaces a cluster's aggregator with `factor` times its upload, or its compute behind a link
// not much slower.

#include "services/coordinator/host_rank.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/coordinator/aggregator_pool.h"

namespace shoal::coordinator {
namespace {

constexpr double kMbit = 1e6 / 8;

common::v1::Capacity Node(double gflops, double upload_mbit) {
  common::v1::Capacity c;
  c.set_cpu_cores(1);
  c.set_matmul_gflops(gflops);
  c.set_upload_bytes_per_second(upload_mbit * kMbit);
  return c;
}

TEST(HostRankTest, WellConnectedIsAtLeastHalfTheBestUpload) {
  EXPECT_TRUE(WellConnected(Node(1, 500), 1000 * kMbit));
  EXPECT_FALSE(WellConnected(Node(1, 499), 1000 * kMbit));
  EXPECT_TRUE(WellConnected(Node(1, 0), 0)) << "none measured: all are";
  EXPECT_FALSE(WellConnected(Node(1, 0), 20 * kMbit)) << "not measured, where another did";
}

TEST(HostRankTest, AFasterUplinkOrMoreComputeBehindALinkNotMuchSlowerIsClearlyBetter) {
  const double factor = 2;
  // Twice the upload, whatever the compute.
  EXPECT_TRUE(ClearlyBetter(Node(1, 200), Node(8, 100), factor));
  EXPECT_FALSE(ClearlyBetter(Node(1, 199), Node(8, 100), factor));
  // Twice the compute, behind an upload at least half the serving one's.
  EXPECT_TRUE(ClearlyBetter(Node(4, 50), Node(2, 100), factor));
  EXPECT_FALSE(ClearlyBetter(Node(3.9, 100), Node(2, 100), factor));
  EXPECT_FALSE(ClearlyBetter(Node(50, 49), Node(2, 100), factor))
      << "more compute behind a slow link does not displace a well-connected aggregator";
  // An upload either did not measure is not compared.
  EXPECT_TRUE(ClearlyBetter(Node(4, 0), Node(2, 100), factor));
  EXPECT_TRUE(ClearlyBetter(Node(4, 5), Node(2, 0), factor));
  EXPECT_FALSE(ClearlyBetter(Node(4, 1000), Node(0, 0), factor)) << "nothing known of it";
}

TEST(AggregatorPoolTest, PicksTheWellConnectedBeforeMoreCompute) {
  AggregatorPool pool(absl::Seconds(15));
  const absl::Time now = absl::Now();
  pool.Register("a:1", Node(10, 5), "", "", now);    // the most compute, a home uplink
  pool.Register("b:1", Node(2, 1000), "", "", now);  // the best upload
  pool.Register("c:1", Node(4, 600), "", "", now);   // well connected, more compute than b
  EXPECT_EQ(pool.Pick({}), "c:1");
  EXPECT_EQ(pool.Pick({{"c:1", 1}}), "b:1") << "fewest tasks first";
  EXPECT_EQ(pool.Pick({}, {"b:1", "c:1"}), "a:1");
  // An aggregator found unreachable sets no bar for the others' uploads.
  pool.Find("b:1")->capacity.set_reachability(common::v1::REACHABILITY_UNREACHABLE);
  pool.Register("d:1", Node(8, 400), "", "", now);  // under half of b's, over half of c's
  EXPECT_EQ(pool.Pick({}), "d:1") << "well connected next to c once b's link is not counted";
  // Without measured uploads, by compute.
  AggregatorPool unmeasured(absl::Seconds(15));
  unmeasured.Register("a:1", Node(1, 0), "", "", now);
  unmeasured.Register("b:1", Node(3, 0), "", "", now);
  EXPECT_EQ(unmeasured.Pick({}), "b:1");
}

}  // namespace
}  // namespace shoal::coordinator
