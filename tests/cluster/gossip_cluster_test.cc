// Gossip training (mode: gossip) with real processes on 127.0.0.1: a coordinator (membership
// only) and four peers pulling each other's snapshots over mutual TLS. One peer is SIGSTOPped
// for a while: the others keep training, their flow-control score for it drops and it is
// demoted; after SIGCONT it is probed, re-admitted and fetched from again; the task completes
// with every peer's evaluation.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-gossip-cluster-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

// The value of one series ("name" or "name{labels}") in a Prometheus text page; -1 if absent.
double Metric(Cluster& cluster, int peer, const std::string& series) {
  auto page = HttpGet(cluster.peer(peer).metrics_address, "/metrics");
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*page, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

// Polls `pred` every 100 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return pred();
}

uint64_t StepOf(const cv1::TaskStatus& s, const std::string& peer) {
  for (const cv1::PeerProgress& p : s.peers()) {
    if (p.peer_id() == peer) return p.step();
  }
  return 0;
}

constexpr char kScoreMin[] = "shoal_peer_gossip_peer_score{stat=\"min\"}";
constexpr char kDemoted[] = "shoal_peer_gossip_peers_demoted";
constexpr char kTimedOut[] = "shoal_peer_gossip_fetches_timed_out_total";
constexpr char kSucceeded[] = "shoal_peer_gossip_fetches_succeeded_total";
constexpr char kServed[] = "shoal_peer_snapshots_served_total";

TEST(GossipClusterTest, StoppedPeerIsDemotedThenReadmitted) {
  Cluster cluster(TempDir());
  // Heartbeats every 3 s (9 s to be declared crashed): the stopped peer stays a member, so its
  // neighbours' flow control (not the coordinator) has to deal with it.
  absl::Status started = cluster.StartCoordinator({"--heartbeat-interval=3s"});
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  started = cluster.StartPeers(0, 4, 4);
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(4, absl::Seconds(60)).ok()) << cluster.LogTails();

  common::v1::TaskSpec spec = SmallTask("gossip-stop");
  spec.set_mode(common::v1::MODE_GOSSIP);
  spec.set_min_participants(4);
  spec.set_round_batches(20);
  spec.set_rounds(100);  // 2000 steps per peer
  spec.mutable_gossip()->set_fetch_probability(1);
  spec.mutable_gossip()->set_timeout_ms(500);
  ASSERT_TRUE(cluster.CreateTask(spec).ok());

  auto status = cluster.WaitFor(
      spec.name(),
      [](const cv1::TaskStatus& s) {
        if (s.phase() != cv1::ROUND_PHASE_GOSSIPING || s.peers_size() != 4) return false;
        for (const auto& p : s.peers()) {
          if (p.step() < 40) return false;
        }
        return true;
      },
      absl::Minutes(2), "all four peers gossiping");
  ASSERT_TRUE(status.ok()) << status.status();
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(Metric(cluster, i, kSucceeded), 0) << "peer-" << i;
    EXPECT_EQ(Metric(cluster, i, kScoreMin), 1000) << "peer-" << i;
  }

  // Stop peer-3 for a while.
  cluster.peer(3).process->Signal(SIGSTOP);
  // Its neighbours time out on it, lower its score and demote it...
  EXPECT_TRUE(Eventually(
      [&] {
        for (int i = 0; i < 3; ++i) {
          if (Metric(cluster, i, kTimedOut) < 1 || Metric(cluster, i, kScoreMin) >= 1000 ||
              Metric(cluster, i, kDemoted) < 1) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(20)))
      << cluster.LogTails();
  // ...and keep training meanwhile.
  auto before = cluster.Status(spec.name());
  ASSERT_TRUE(before.ok());
  // Where peer-3 stopped: read now, seconds after the stop, since a status read before it could
  // miss its last reported steps.
  const uint64_t stopped_at = StepOf(*before, "peer-3");
  absl::StatusOr<cv1::TaskStatus> during = before;
  EXPECT_TRUE(Eventually(
      [&] {
        during = cluster.Status(spec.name());
        if (!during.ok()) return false;
        for (int i = 0; i < 3; ++i) {
          const std::string id = absl::StrCat("peer-", i);
          if (StepOf(*during, id) <= StepOf(*before, id)) return false;
        }
        return true;
      },
      absl::Seconds(60)))
      << "the three running peers did not all advance\n"
      << cluster.LogTails();
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(StepOf(*during, "peer-3"), stopped_at);
  EXPECT_EQ(during->peers_size(), 4);  // still a member
  for (int i = 0; i < 3; ++i) EXPECT_LE(Metric(cluster, i, kScoreMin), 900) << "peer-" << i;

  // Resume it. Requests that queued up while it was stopped are answered at once; after that,
  // new fetches from it mean a neighbour picked it again.
  cluster.peer(3).process->Signal(SIGCONT);
  // It runs again once it reports a new step (by then what queued up has been answered).
  EXPECT_TRUE(Eventually(
      [&] {
        auto s = cluster.Status(spec.name());
        return s.ok() && StepOf(*s, "peer-3") > stopped_at;
      },
      absl::Seconds(60)))
      << "peer-3 did not resume\n"
      << cluster.LogTails();
  const double served_after_resume = Metric(cluster, 3, kServed);
  EXPECT_TRUE(Eventually(
      [&] {
        if (Metric(cluster, 3, kServed) < served_after_resume + 3) return false;
        // Some neighbour re-admitted it at full score.
        for (int i = 0; i < 3; ++i) {
          if (Metric(cluster, i, kScoreMin) == 1000 && Metric(cluster, i, kDemoted) == 0) {
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30)))
      << "served " << Metric(cluster, 3, kServed) << " (was " << served_after_resume << ")\n"
      << cluster.LogTails();

  // Everyone finishes; the final summary holds the four evaluations.
  status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(5), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->history_size(), static_cast<int>(spec.rounds()));
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_EQ(last.participants_size(), 4);
  EXPECT_TRUE(last.evaluated());
  EXPECT_EQ(last.test_samples(), 1000u);  // four slices of test_limit 1000
  EXPECT_GT(last.test_accuracy(), 0.6);
  ASSERT_EQ(status->peers_size(), 4);
  for (const cv1::PeerProgress& p : status->peers()) {
    SCOPED_TRACE(p.ShortDebugString());
    EXPECT_EQ(p.state(), "done");
    EXPECT_EQ(p.step(), 2000u);
    EXPECT_GT(p.clock(), 0);
    EXPECT_GT(p.loss(), 0);
  }
  auto coordinator_metrics = HttpGet(cluster.coordinator().metrics_address, "/metrics");
  ASSERT_TRUE(coordinator_metrics.ok());
  EXPECT_THAT(*coordinator_metrics,
              ::testing::HasSubstr("shoal_coordinator_gossip_peers_done_total 4"));

  for (int i = 0; i < 4; ++i) {
    process::ExitStatus exit = cluster.peer(i).process->Stop(absl::Seconds(10));
    EXPECT_TRUE(exit.success()) << "peer-" << i << ": " << exit.ToString();
  }
}

// Binds 127.0.0.1:0 to find a free port (closed again: a small race, fine for a test).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string BinDir() {
  const char* dir = std::getenv("SHOAL_BIN_DIR");
  if (dir != nullptr) return dir;
  auto self = process::SelfExecutableDir();
  return self.ok() ? *self + "/../../bin" : "build/bin";
}

std::unique_ptr<process::Process> StartStatic(const std::string& dir, const std::string& node,
                                              std::vector<std::string> extra = {}) {
  process::ProcessOptions o;
  o.name = node;
  o.binary = BinDir() + "/shoal-peer";
  o.args = {"--dpwa-config=" + dir + "/dpwa.yaml",
            "--dpwa-node=" + node,
            "--task-file=" + dir + "/task.yaml",
            "--data-dir=/usr/share/datasets/fashion-mnist",
            "--insecure",
            "--report-out=" + dir + "/" + node + ".json",
            "--final-model-out=" + dir + "/" + node + ".model",
            "--exit-when-done"};
  o.args.insert(o.args.end(), extra.begin(), extra.end());
  o.log_path = dir + "/" + node + ".log";
  auto p = process::Process::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Without a coordinator: three shoal-peer processes read a dpwa YAML config (dpwa's format,
// static node list) and a task file, gossip, and each writes its report and final model.
TEST(GossipClusterTest, StaticMembershipFromDpwaConfig) {
  const std::string dir = TempDir();
  std::string nodes;
  for (int i = 0; i < 3; ++i) {
    absl::StrAppend(&nodes, "  - {name: w", i, ", host: 127.0.0.1, port: ", FreePort(), "}\n");
  }
  {
    std::ofstream f(dir + "/dpwa.yaml");
    f << "---\n- nodes:\n"
      << nodes
      << "- fetch_probability: 1\n- timeout_ms: 2000\n- interpolation: clock\n"
         "- divergence_threshold: 0\n- constant: { value: 0.5 }\n- clock: 0\n- loss: 0\n";
    std::ofstream t(dir + "/task.yaml");
    t << "name: static-gossip\nmodel: mlp\ndataset: {train_limit: 6000, test_limit: 900}\n"
         "optimizer: {kind: sgd, learning_rate: 0.01, momentum: 0.9}\nrounds: 4\n"
         "round_batches: 50\n";
  }
  // A wrong node name is a clear error, exit code 2.
  {
    auto bad = StartStatic(dir, "w9");
    ASSERT_NE(bad, nullptr);
    auto exit = bad->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok());
    EXPECT_EQ(exit->code, 2);
    EXPECT_THAT(bad->LogTail(), ::testing::HasSubstr("--dpwa-node: no node \"w9\""));
  }
  std::vector<std::unique_ptr<process::Process>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(StartStatic(dir, absl::StrCat("w", i)));
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(peers[i], nullptr);
    auto exit = peers[i]->Wait(absl::Minutes(3));
    ASSERT_TRUE(exit.ok()) << peers[i]->LogTail();
    EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << peers[i]->LogTail();
  }
  for (int i = 0; i < 3; ++i) {
    const std::string report = ReadFile(absl::StrCat(dir, "/w", i, ".json"));
    SCOPED_TRACE(report);
    EXPECT_THAT(report, ::testing::HasSubstr("\"ok\": true"));
    EXPECT_THAT(report, ::testing::HasSubstr("\"steps\": 200"));
    EXPECT_THAT(report, ::testing::HasSubstr("\"total\": 300"));
    EXPECT_THAT(report, ::testing::Not(::testing::HasSubstr("\"fetches\": 0,")));
    EXPECT_FALSE(ReadFile(absl::StrCat(dir, "/w", i, ".model")).empty());
  }
}

}  // namespace
}  // namespace shoal::testing
