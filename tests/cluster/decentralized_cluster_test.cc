// Decentralized training (mode: decentralized) with real processes on 127.0.0.1: a coordinator
// and peers, no aggregator. Peers exchange weights directly through their PeerService and every
// participant ends each round holding the same averaged model.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "shoal/peer/v1/peer.grpc.pb.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-dec-cluster-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

// A small fast decentralized task: MLP on a slice of Fashion-MNIST.
common::v1::TaskSpec DecentralizedTask(const std::string& name, uint32_t rounds,
                                       uint32_t round_batches) {
  common::v1::TaskSpec spec = SmallTask(name);
  spec.set_mode(common::v1::MODE_DECENTRALIZED);
  spec.set_rounds(rounds);
  spec.set_round_batches(round_batches);
  spec.set_min_participants(2);
  spec.set_round_deadline_seconds(30);
  spec.set_max_connection_retry(2);
  return spec;
}

// The digest of a peer's GLOBAL snapshot of `round` (fetched over mutual TLS like another peer).
absl::StatusOr<uint64_t> GlobalDigest(Cluster& cluster, int peer, const std::string& task,
                                      uint64_t round) {
  auto stub = peer::v1::PeerService::NewStub(
      rpc::MakeChannel(cluster.peer(peer).address, cluster.ClientCredentials()));
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(20));
  peer::v1::GetSnapshotRequest request;
  request.set_task(task);
  request.set_kind(peer::v1::SNAPSHOT_KIND_GLOBAL);
  request.set_round(round);
  request.set_peer_id("test");
  auto reader = stub->GetSnapshot(&context, request);
  auto model = rpc::ReadModelStream(*reader, tensor::DecoderLimits{}, &context);
  if (!model.ok()) return model.status();
  if (model->meta.version() != round) {
    return absl::InternalError(
        absl::StrCat("asked for round ", round, ", got ", model->meta.version()));
  }
  return model->model.Digest();
}

// The newest round whose averaged model `peer` serves as its GLOBAL snapshot, checked against
// the digest the coordinator recorded for that round. Fails when it serves none of them or a
// different model.
absl::StatusOr<uint64_t> HeldRound(Cluster& cluster, int peer, const cv1::TaskStatus& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    const cv1::RoundSummary& round = status.history(i);
    absl::StatusOr<uint64_t> digest =
        GlobalDigest(cluster, peer, status.spec().name(), round.round());
    if (absl::IsFailedPrecondition(digest.status())) continue;  // it holds another round
    if (!digest.ok()) return digest.status();
    if (*digest != round.model_digest()) {
      return absl::InternalError(absl::StrCat("peer-", peer, " holds a model of round ",
                                              round.round(), " with digest ", *digest,
                                              ", the round's digest is ", round.model_digest()));
    }
    return round.round();
  }
  return absl::NotFoundError(absl::StrCat("peer-", peer, " serves no round's model"));
}

// `batch_floor_ms`: Cluster::set_batch_floor_ms, for a task that must still run when the test
// acts (the late joiner's start-up takes about 4 s).
void StartCoordinatorAndPeers(Cluster& cluster, int peers, int shards, int batch_floor_ms) {
  cluster.set_batch_floor_ms(batch_floor_ms);
  absl::Status started = cluster.StartCoordinator();
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  started = cluster.StartPeers(0, peers, shards);
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(peers, absl::Seconds(60)).ok()) << cluster.LogTails();
}

bool Completed(const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; }

// Three peers train several rounds and hold identical models after every round; a fourth joins
// at round 3, syncs the model from a peer that completed the last round, and holds the same
// model as the others after its first round.
TEST(DecentralizedClusterTest, IdenticalModelsEveryRoundAndLateJoinerSyncs) {
  Cluster cluster(TempDir());
  // Rounds of at least 120 x 15 ms = 1.8 s, so the fourth peer (started after round 2) joins
  // round 3 or 4.
  StartCoordinatorAndPeers(cluster, 3, 4, /*batch_floor_ms=*/15);
  if (HasFatalFailure()) return;
  const common::v1::TaskSpec spec = DecentralizedTask("dec-identical", 8, 120);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.model_version() >= 2; },
      absl::Minutes(3), "two completed rounds");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_LT(status->model_version(), spec.rounds()) << "the task ran too fast to join late";
  {
    absl::Status started = cluster.StartPeer(3, 4);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }

  status = cluster.WaitFor(spec.name(), Completed, absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));

  std::set<uint64_t> digests;
  uint64_t first_round_of_late_joiner = 0;
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    EXPECT_NE(round.model_digest(), 0u);
    EXPECT_TRUE(digests.insert(round.model_digest()).second) << "the model did not change";
    // Normally 3 (then 4); a peer starved of CPU may miss a round's joins on a loaded machine.
    EXPECT_GE(round.participants_size(), 2);
    EXPECT_GT(round.num_samples(), 0u);
    EXPECT_TRUE(round.removed().empty());
    const bool late = std::find(round.participants().begin(), round.participants().end(),
                                "peer-3") != round.participants().end();
    if (late && first_round_of_late_joiner == 0) first_round_of_late_joiner = round.round();
    if (round.round() <= 2) {
      EXPECT_THAT(round.participants(), Not(Contains("peer-3")));
    }
  }
  ASSERT_GE(first_round_of_late_joiner, 3u) << "peer-3 never took part in a round";
  EXPECT_LT(first_round_of_late_joiner, spec.rounds()) << "peer-3 joined only the last round";
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_TRUE(last.evaluated());
  EXPECT_GT(last.test_accuracy(), 0.6);

  // Every peer serves the averaged model of a round since the late joiner's first one,
  // bit-identical to the digest of that round — the late joiner included.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<uint64_t> held = HeldRound(cluster, i, *status);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_GE(*held, first_round_of_late_joiner) << "peer-" << i;
  }

  // The late joiner synced and pulled the others' updates; the coordinator counted the sync.
  auto late_metrics = HttpGet(cluster.peer(3).metrics_address, "/metrics");
  ASSERT_TRUE(late_metrics.ok());
  // (It syncs again when a round completes while it waits for the next one to open.)
  EXPECT_THAT(*late_metrics, HasSubstr("shoal_peer_decentralized_sync_transfers_total"));
  EXPECT_THAT(*late_metrics, Not(HasSubstr("shoal_peer_decentralized_sync_transfers_total 0\n")));
  // (A sync may also fail and be retried: the provider finishes another round mid-transfer and
  // answers FAILED_PRECONDITION for the older round; the coordinator then offers the newer one.)
  EXPECT_THAT(*late_metrics, Not(HasSubstr("shoal_peer_peer_bytes_pulled_total 0\n")));
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics, HasSubstr("shoal_coordinator_decentralized_sync_transfers"));
  // Every participant of every round reported the same digest in its SharingDone.
  EXPECT_THAT(*coordinator_metrics,
              HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));

  for (int i = 0; i < 4; ++i) {
    process::ExitStatus exit = cluster.peer(i).process->Stop(absl::Seconds(10));
    EXPECT_TRUE(exit.success()) << "peer-" << i << ": " << exit.ToString();
  }
}

// With compression (top-k 1%, int8 values) each participant serves its round update as a
// compressed delta: every round still ends with identical models everywhere, a late joiner
// (which syncs the whole model, raw) contributes deltas like the others, the task learns, and
// what the peers pull is a small fraction of what whole models would be.
TEST(DecentralizedClusterTest, CompressedRoundUpdatesEndIdenticalAtAFractionOfTheBytes) {
  Cluster cluster(TempDir());
  // Many short rounds, each at least 15 x 40 ms = 0.6 s: the late joiner's process takes about
  // 4 s to start and connect, so with 6 rounds of 60 batches the task could end before it
  // joined one. 24 rounds of 15 train as much and leave it most of the task.
  StartCoordinatorAndPeers(cluster, 3, 4, /*batch_floor_ms=*/40);
  if (HasFatalFailure()) return;
  common::v1::TaskSpec spec = DecentralizedTask("dec-topk", 24, 15);
  spec.set_compression(common::v1::COMPRESSION_TOPK);
  spec.set_topk_ratio(0.01);
  spec.set_topk_values(common::v1::COMPRESSION_INT8);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.model_version() >= 1; },
      absl::Minutes(3), "a completed round");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_LT(status->model_version(), spec.rounds() - 1) << "the task ran too fast to join late";
  {
    absl::Status started = cluster.StartPeer(3, 4);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  status = cluster.WaitFor(spec.name(), Completed, absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  uint64_t late_rounds = 0;
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    EXPECT_NE(round.model_digest(), 0u);
    EXPECT_TRUE(round.removed().empty());
    late_rounds += std::count(round.participants().begin(), round.participants().end(), "peer-3");
  }
  EXPECT_GE(late_rounds, 1u) << "peer-3 never took part in a round";
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_TRUE(last.evaluated());
  EXPECT_GT(last.test_accuracy(), 0.5);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<uint64_t> held = HeldRound(cluster, i, *status);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, spec.rounds()) << "peer-" << i;
  }
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics,
              HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));

  // peer-0 pulled the other participants' updates of each round it was in (its own stays
  // home): at 1% with int8 values each is about a hundredth of the model (the MLP's 636,040
  // bytes). A model sync, should it have fallen behind, pulls a whole model.
  auto metrics = HttpGet(cluster.peer(0).metrics_address, "/metrics");
  ASSERT_TRUE(metrics.ok());
  const double model_bytes = 159010.0 * 4;
  double rounds_in = 0;
  double fetched = 0;  // the updates of the others in those rounds
  for (const cv1::RoundSummary& round : status->history()) {
    const auto& p = round.participants();
    if (std::find(p.begin(), p.end(), "peer-0") == p.end()) continue;
    rounds_in += 1;
    fetched += round.participants_size() - 1;
  }
  ASSERT_GE(rounds_in, 1);
  const double sent = MetricValue(*metrics, "shoal_peer_update_bytes_sent_total");
  const double raw = MetricValue(*metrics, "shoal_peer_update_bytes_raw_total");
  EXPECT_GE(raw, model_bytes * rounds_in);
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent * 50, raw);
  const double pulled =
      MetricValue(*metrics, "shoal_peer_peer_bytes_pulled_total") -
      model_bytes * MetricValue(*metrics, "shoal_peer_decentralized_sync_transfers_total");
  EXPECT_GT(pulled, 0);
  EXPECT_LT(pulled * 30, fetched * model_bytes) << "pulled " << pulled << " bytes";
}

// The coordinator crashes mid-task: the peers keep their models, reconnect, answer the
// re-assignment with ModelHeld{the round they hold}, and the task resumes and completes with
// identical models.
void CoordinatorCrashResumesFromThePeersModels(Cluster& cluster) {
  const common::v1::TaskSpec spec = DecentralizedTask("dec-restart", 6, 80);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.model_version() >= 2; },
      absl::Minutes(3), "two completed rounds");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_LT(status->model_version(), spec.rounds());
  {
    absl::Status restarted = cluster.RestartCoordinator(/*crash=*/true);
    ASSERT_TRUE(restarted.ok()) << restarted << "\n" << cluster.LogTails();
  }
  status = cluster.WaitFor(spec.name(), Completed, absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->model_version(), spec.rounds());
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_EQ(last.round(), spec.rounds());
  EXPECT_GE(last.participants_size(), 2) << last.ShortDebugString();
  // Rounds after the restart still end with identical models everywhere.
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> held = HeldRound(cluster, i, *status);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_GT(*held, 2u) << "peer-" << i;
  }
}

// A peer SIGKILLed in the middle of a round: the others complete that round without it and
// finish the task.
void PeerKilledMidRoundOthersCompleteTheRound(Cluster& cluster) {
  const common::v1::TaskSpec spec = DecentralizedTask("dec-kill", 5, 60);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  // Round 2 is open and peer-2 joined it and is training: kill it.
  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        if (s.round() < 2 || s.model_version() + 1 != s.round()) return false;
        for (const cv1::PeerProgress& p : s.peers()) {
          if (p.peer_id() == "peer-2" && p.state() == "joined") return true;
        }
        return false;
      },
      absl::Minutes(3), "peer-2 training in round 2");
  ASSERT_TRUE(status.ok()) << status.status();
  const uint64_t killed_round = status->round();
  cluster.peer(2).process->Signal(SIGKILL);

  status = cluster.WaitFor(spec.name(), Completed, absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    EXPECT_NE(round.model_digest(), 0u);
    if (round.round() < killed_round) {
      EXPECT_GE(round.participants_size(), 2);  // 3 unless a peer was starved of CPU
    }
    if (round.round() >= killed_round) {
      EXPECT_THAT(round.participants(), Not(Contains("peer-2")));
      EXPECT_EQ(round.participants_size(), 2);
    }
    if (round.round() == killed_round) {
      EXPECT_EQ(round.joins(), 3u);
      EXPECT_EQ(round.leaves(), 1u);
    }
  }
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics,
              HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));
  // The two survivors serve the final model, bit-identical to the last round's digest.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<uint64_t> held = HeldRound(cluster, i, *status);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, spec.rounds()) << "peer-" << i;
  }
}

// Every peer of a task SIGKILLed at once once two rounds completed, and started again with the
// same --state-dir: they hold the last completed round's model again (kept on disk) and the task
// goes on from it, every round once, the rounds before the kill unchanged (without the kept
// model, the task fails a minute later: "round N's model is lost").
void EveryPeerKilledResumesFromTheModelKeptOnDisk(Cluster& cluster,
                                                  const std::vector<std::string>& peer_args) {
  const common::v1::TaskSpec spec = DecentralizedTask("dec-all-killed", 5, 60);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());
  auto before = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.model_version() >= 2; },
      absl::Minutes(3), "two completed rounds");
  ASSERT_TRUE(before.ok()) << before.status();
  for (int i = 0; i < 3; ++i) cluster.peer(i).process->Signal(SIGKILL);
  absl::Status started = cluster.StartPeers(0, 3, 3, peer_args);
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();

  auto status = cluster.WaitForEnd(spec);
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  ASSERT_EQ(status->state(), cv1::TASK_STATE_COMPLETED) << status->message();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  for (int i = 0; i < status->history_size(); ++i) {
    EXPECT_EQ(status->history(i).round(), static_cast<uint64_t>(i + 1));
  }
  for (const cv1::RoundSummary& round : before->history()) {
    EXPECT_EQ(status->history(round.round() - 1).model_digest(), round.model_digest())
        << "round " << round.round();
  }
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> held = HeldRound(cluster, i, *status);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, spec.rounds()) << "peer-" << i;
  }
  // Held again from disk, not synced from a peer that kept it in memory.
  EXPECT_THAT(process::TailFile(cluster.dir() + "/peer-0.log", 400),
              HasSubstr("kept on disk before a restart"));
}

// The three above on one cluster of three peers, one task after the other: the coordinator's
// crash first, then (at the restarted coordinator) the peer's death, then every peer's.
TEST(DecentralizedClusterTest, CoordinatorCrashThenPeerKilledMidRoundThenEveryPeerKilled) {
  Cluster cluster(TempDir());
  const std::vector<std::string> peer_args = {"--state-dir=" + cluster.dir() +
                                              "/peer-{index}-state"};
  // Rounds of at least 60 x 15 ms = 0.9 s: each case acts in the middle of its task.
  cluster.set_batch_floor_ms(15);
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeers(0, 3, 3, peer_args).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();
  CoordinatorCrashResumesFromThePeersModels(cluster);
  if (HasFatalFailure()) return;
  // Every peer back at the restarted coordinator before the next task, as at the start.
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();
  PeerKilledMidRoundOthersCompleteTheRound(cluster);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(cluster.StartPeers(2, 1, 3, peer_args).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(3, absl::Seconds(60)).ok()) << cluster.LogTails();
  EveryPeerKilledResumesFromTheModelKeptOnDisk(cluster, peer_args);
}

// A peer nobody can reach (it advertises, with --advertise, an address where nothing listens:
// a port this test holds and never serves; --relay=off, though no aggregator could relay) is
// removed from the round after max_connection_retry retries; the others continue without it.
TEST(DecentralizedClusterTest, UnreachablePeerIsRemovedAfterMaxConnectionRetry) {
  Cluster cluster(TempDir());
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  absl::StatusOr<ReservedPort> nowhere = ReservedPort::Reserve();
  ASSERT_TRUE(nowhere.ok()) << nowhere.status();
  {
    absl::Status started = cluster.StartPeers(0, 3, 4);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
    started = cluster.StartPeer(3, 4, {"--advertise=" + nowhere->address(), "--relay=off"});
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();
  // Two rounds: the peer is removed from the first it takes part in and sits out any after it (a
  // third would try it again and spend its retries once more, about 10 s). Round 1 opens once
  // three peers hold the initial model, so under load peer-3 may come only to round 2.
  common::v1::TaskSpec spec = DecentralizedTask("dec-refuse", 2, 20);
  spec.set_min_participants(3);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  auto status = cluster.WaitFor(spec.name(), Completed, absl::Minutes(6), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  int removed_from = 0;  // rounds peer-3 was removed from
  for (const cv1::RoundSummary& round : status->history()) {
    if (round.removed().empty()) continue;
    ++removed_from;
    EXPECT_THAT(round.removed(), ElementsAre("peer-3")) << round.ShortDebugString();
    EXPECT_GE(round.connection_retries(), spec.max_connection_retry()) << round.ShortDebugString();
  }
  EXPECT_EQ(removed_from, 1) << status->ShortDebugString();
  for (const cv1::RoundSummary& round : status->history()) {
    SCOPED_TRACE(round.ShortDebugString());
    EXPECT_THAT(round.participants(), Not(Contains("peer-3")));
    EXPECT_GE(round.participants_size(), 3);  // min_participants
    EXPECT_NE(round.model_digest(), 0u);
  }
  // The unreachable peer was told it was removed; the others counted failed probes.
  auto removed = HttpGet(cluster.peer(3).metrics_address, "/metrics");
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, Not(HasSubstr("shoal_peer_decentralized_rounds_refused_total 0\n")));
  auto prober = HttpGet(cluster.peer(0).metrics_address, "/metrics");
  ASSERT_TRUE(prober.ok());
  EXPECT_THAT(*prober, Not(HasSubstr("shoal_peer_decentralized_probes_failed_total 0\n")));
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics,
              Not(HasSubstr("shoal_coordinator_decentralized_removed_peers_total 0\n")));
  EXPECT_THAT(*coordinator_metrics,
              HasSubstr("shoal_coordinator_decentralized_digest_mismatches_total 0\n"));
}

// `shoalctl local` runs a decentralized task file end to end with no aggregator (the way users
// start one; the example deploy/tasks/fashion-mnist-decentralized.yaml shortened to MLP rounds).
TEST(DecentralizedClusterTest, ShoalctlLocalRunsADecentralizedTaskWithoutAnAggregator) {
  const std::string dir = TempDir();
  const std::string task_file = dir + "/task.yaml";
  {
    std::ofstream out(task_file);
    out << "name: local-dec\n"
           "mode: decentralized\n"
           "model: mlp\n"
           "dataset: {name: fashion-mnist, partition: iid, train_limit: 6000, test_limit: 600}\n"
           "batch_size: 32\n"
           "optimizer: {kind: sgd, learning_rate: 0.05, momentum: 0.9}\n"
           "round_batches: 20\n"
           "rounds: 3\n"
           "min_participants: 3\n"
           "round_deadline_seconds: 60\n"
           "aggregation: mean\n"
           "seed: 5\n";
  }
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  process::ProcessOptions options;
  options.name = "shoalctl";
  options.binary = std::string(bin != nullptr ? bin : "build/bin") + "/shoalctl";
  options.args = {"local", "--peers", "3", "--task", task_file, "--state-dir", dir + "/state"};
  options.log_path = dir + "/shoalctl.log";
  auto launcher = process::Process::Start(std::move(options));
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  auto exit = (*launcher)->Wait(absl::Minutes(4));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << process::TailFile(dir + "/shoalctl.log", 40);
  const std::string output = process::TailFile(dir + "/shoalctl.log", 200);
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << output;
  EXPECT_THAT(output, HasSubstr("starting 1 coordinator, 0 aggregator(s), 3 peer(s)"));
  EXPECT_THAT(output, HasSubstr("retries  removed"));
  EXPECT_THAT(output, HasSubstr("overhead"));
  EXPECT_THAT(output, HasSubstr("task local-dec completed after 3/3 rounds"));
  EXPECT_THAT(output, HasSubstr("final test accuracy: 0."));
  std::ifstream aggregator_log(dir + "/state/logs/aggregator-0.log");
  EXPECT_FALSE(aggregator_log.good()) << "an aggregator was started";
}

}  // namespace
}  // namespace shoal::testing
