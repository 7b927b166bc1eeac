// Secure aggregation in decentralized mode with real processes on 127.0.0.1 (mutual TLS): a
// coordinator and four peers, no aggregator. Every participant serves its round update masked
// with pairwise masks agreed with the others (their mask keys signed with the identity keys the
// coordinator hands out in the PeerList). A participant SIGKILLed after masking, once the others
// hold every masked update and before the survivors are fixed, is left out: each survivor
// reveals its self seed and its one pairwise seed with the dead peer, and all three end the
// round with the same model, the mean of their own three updates. With privacy.dp at level peer
// and noise distributed the same kill makes the three left mask again with fresh noise shares.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

std::string PeerLog(Cluster& cluster, int peer) {
  std::ifstream in(cluster.dir() + "/peer-" + std::to_string(peer) + ".log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Polls peer `peer`'s log until it contains `text`, for at most `timeout`.
bool WaitForPeerLog(Cluster& cluster, int peer, const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (PeerLog(cluster, peer).find(text) == std::string::npos) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

TEST(DecentralizedSecureClusterTest, APeerKilledAfterMaskingIsLeftOutAndTheSurvivorsFinish) {
  auto dir = MakeTestTempDir("shoal-dec-secure-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 3, 4).ok()) << cluster.LogTails();
  // peer-3 stalls in round 1 once it holds every masked update (its own is served already).
  ASSERT_TRUE(cluster.StartTestPeer(3, 4, {"--test-stall-masked-round=1"}).ok())
      << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("dec-secure");
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_rounds(2);
  // A round opens once three peers hold the model, and joins close when the first of them is
  // ready: the stalling peer must report its model before then. 200 batches (0.2 s or more of
  // training) leave it that time on a loaded machine; 20 left about 20 ms.
  spec.set_round_batches(200);
  spec.set_min_participants(3);
  spec.set_round_deadline_seconds(30);
  spec.mutable_privacy()->mutable_secure_aggregation()->set_clip_norm(5.0);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Everyone holds the four masked updates of round 1; peer-3 stalls before saying so.
  ASSERT_TRUE(WaitForPeerLog(cluster, 3, "round 1: holding every masked update; stalling",
                             absl::Seconds(60)))
      << cluster.LogTails();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        WaitForPeerLog(cluster, i, ": holding the masked updates of all 4", absl::Seconds(30)))
        << "peer-" << i << "\n"
        << cluster.LogTails();
  }
  cluster.peer(3).process->Signal(SIGKILL);

  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status() << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  ASSERT_EQ(status->history_size(), 2);
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    EXPECT_NE(round.model_digest(), 0u);
    EXPECT_EQ(round.participants_size(), 3);
  }
  EXPECT_EQ(status->history(0).leaves(), 1u);
  // The masks cancelled: a model left with masks in it would be noise, not a classifier.
  EXPECT_GT(status->history(1).test_accuracy(), 0.5);
  auto metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("peer-", i));
    const std::string log = PeerLog(cluster, i);
    // Round 1: its self seed and its pairwise seed with peer-3 only; the sum of the survivors.
    EXPECT_THAT(log, ContainsRegex("round 1 attempt [0-9]+: revealing the seeds for the survivors "
                                   "peer-0, peer-1, peer-2 \\(1 pairwise seeds with dropped"));
    EXPECT_THAT(log, ContainsRegex("round 1 attempt [0-9]+: aggregated 3 masked updates \\(secure "
                                   "aggregation: peer-0, peer-1, peer-2\\)"));
    EXPECT_THAT(log, ContainsRegex("round 2 attempt [0-9]+: revealing the seeds for the survivors "
                                   "peer-0, peer-1, peer-2 \\(0 pairwise seeds"));
  }
  // privacy.dp at level peer, noise distributed, in the same cluster: the same kill (of a fresh
  // stalling peer-4), but the three left mask again, each with a fresh noise share for three (a
  // sum short of the dead peer's share would carry less noise than the accountant is charged
  // for), so they reveal no pairwise seed with it.
  ASSERT_TRUE(cluster.StartTestPeer(4, 5, {"--test-stall-masked-round=1"}).ok())
      << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();
  common::v1::TaskSpec dp_spec = spec;
  dp_spec.set_name("dec-secure-dp");
  dp_spec.set_rounds(1);
  dp_spec.set_round_batches(200);  // as above: time for peer-4, fresh, to join round 1
  dp_spec.mutable_privacy()->mutable_secure_aggregation()->clear_clip_norm();
  common::v1::DpSpec& dp = *dp_spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(common::v1::DP_NOISE_DISTRIBUTED);
  dp.set_clip_norm(1.0);
  dp.set_noise_multiplier(1.0);
  dp.set_delta(1e-5);
  const absl::Time dp_start = absl::Now();
  ASSERT_TRUE(cluster.CreateTask(dp_spec).ok());
  ASSERT_TRUE(WaitForPeerLog(cluster, 4, "round 1: holding every masked update; stalling",
                             absl::Seconds(60)))
      << cluster.LogTails();
  // peer-4 holds every masked update: the round is sharing, every update is masked.
  cluster.peer(4).process->Signal(SIGKILL);
  status = cluster.WaitForEnd(dp_spec);
  ASSERT_TRUE(status.ok()) << status.status() << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message() << cluster.LogTails();
  std::printf("[ figure ] dec-secure-dp: %.1f s\n", absl::ToDoubleSeconds(absl::Now() - dp_start));
  ASSERT_EQ(status->history_size(), 1);
  EXPECT_EQ(status->history(0).participants_size(), 3);
  EXPECT_EQ(status->privacy().rounds(), 1u);  // charged once, when the round opened
  metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("peer-", i));
    const std::string log = PeerLog(cluster, i);
    EXPECT_THAT(log,
                HasSubstr("carry noise of stddev 1 over the masking's number of participants"));
    EXPECT_THAT(log, ContainsRegex("task dec-secure-dp round 1 attempt [0-9]+: serving the round "
                                   "update masked with peer-0, peer-1, peer-2\n"));
    EXPECT_THAT(log, ContainsRegex("task dec-secure-dp round 1 attempt [0-9]+: revealing the seeds "
                                   "for the survivors peer-0, peer-1, peer-2 \\(0 pairwise seeds"));
    EXPECT_THAT(log, ContainsRegex("task dec-secure-dp round 1 attempt [0-9]+: aggregated 3 masked "
                                   "updates"));
  }
}

}  // namespace
}  // namespace shoal::testing
