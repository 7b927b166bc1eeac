// Gossip without a coordinator and without a member list: eight shoal-peer processes on
// 127.0.0.1, each given only one bootstrap address (the first peer's DHT port), find each other
// through the Kademlia DHT (signed announcements) and gossip as they would from a dpwa YAML
// list: every peer trains all its steps, fetches from the others and ends with the accuracy the
// coordinator's gossip test asks for. An impostor with a certificate of another CA, announcing
// itself as one of the eight, is ignored by all.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/shoalctl/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

constexpr int kPeers = 8;

std::string BinDir() {
  const char* dir = std::getenv("SHOAL_BIN_DIR");
  if (dir != nullptr) return dir;
  auto self = process::SelfExecutableDir();
  return self.ok() ? *self + "/../../bin" : "build/bin";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A number field of a one-line JSON report ("key": value); -1 when absent.
double ReportNumber(const std::string& report, const std::string& key) {
  const std::string tag = "\"" + key + "\": ";
  const size_t at = report.find(tag);
  if (at == std::string::npos) return -1;
  const size_t end = report.find_first_of(",}", at);
  double v = -1;
  if (!absl::SimpleAtod(report.substr(at + tag.size(), end - at - tag.size()), &v)) return -1;
  return v;
}

void GenCerts(const std::string& out, const std::vector<std::string>& names) {
  process::ProcessOptions o;
  o.name = "gen-certs";
  o.binary = BinDir() + "/shoal-gen-certs";
  o.args = {out};
  o.args.insert(o.args.end(), names.begin(), names.end());
  o.log_path = out + ".log";
  auto p = process::Process::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  auto exit = (*p)->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok() && exit->success()) << (*p)->LogTail();
}

std::unique_ptr<process::Process> StartDhtPeer(const std::string& dir, const std::string& name,
                                               const std::string& tls_dir,
                                               std::vector<std::string> extra) {
  process::ProcessOptions o;
  o.name = name;
  o.binary = BinDir() + "/shoal-peer";
  o.args = {"--dht-listen=127.0.0.1:0",
            "--dht-min-members=" + std::to_string(kPeers),
            "--task-file=" + dir + "/task.yaml",
            "--data-dir=/usr/share/datasets/fashion-mnist",
            "--tls-dir=" + tls_dir,
            "--address-file=" + dir + "/" + name + ".addr",
            "--report-out=" + dir + "/" + name + ".json",
            "--exit-when-done"};
  o.args.insert(o.args.end(), extra.begin(), extra.end());
  o.log_path = dir + "/" + name + ".log";
  auto p = process::Process::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(DhtGossipClusterTest, EightPeersFromOneBootstrapAddressConverge) {
  auto made = MakeTestTempDir("shoal-dht-gossip-");
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string dir = *made;
  std::vector<std::string> names;
  for (int i = 0; i < kPeers; ++i) names.push_back(absl::StrCat("peer-", i));
  GenCerts(dir + "/certs", names);
  // The impostor: the name of a real peer, a certificate of its own CA.
  GenCerts(dir + "/rogue", {"peer-3"});
  {
    std::ofstream t(dir + "/task.yaml");
    t << "name: dht-gossip\nmode: gossip\nmodel: mlp\n"
         "dataset: {train_limit: 6000, test_limit: 1600}\n"
         "optimizer: {kind: sgd, learning_rate: 0.01, momentum: 0.9}\nrounds: 2\n"
         "round_batches: 30\n"
         "gossip: {fetch_probability: 1, timeout_ms: 2000, interpolation: clock}\n";
  }

  std::vector<std::unique_ptr<process::Process>> peers;
  peers.push_back(StartDhtPeer(dir, "peer-0", dir + "/certs/peer-0", {"--shard=0/8"}));
  ASSERT_NE(peers[0], nullptr);
  auto addresses =
      process::WaitForAddressFile(dir + "/peer-0.addr", peers[0].get(), Scaled(absl::Seconds(60)));
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  const std::string bootstrap = "--dht-bootstrap=" + (*addresses)["dht"];
  ASSERT_NE((*addresses)["dht"], "");

  auto impostor = StartDhtPeer(dir, "impostor", dir + "/rogue/peer-3", {bootstrap});
  ASSERT_NE(impostor, nullptr);
  for (int i = 1; i < kPeers; ++i) {
    peers.push_back(StartDhtPeer(dir, names[i], dir + "/certs/" + names[i],
                                 {bootstrap, absl::StrCat("--shard=", i, "/", kPeers)}));
    ASSERT_NE(peers.back(), nullptr);
  }
  for (int i = 0; i < kPeers; ++i) {
    auto exit = peers[i]->Wait(Scaled(absl::Minutes(3)));
    ASSERT_TRUE(exit.ok()) << names[i] << ": " << peers[i]->LogTail();
    EXPECT_TRUE(exit->success()) << names[i] << ": " << exit->ToString() << "\n"
                                 << peers[i]->LogTail();
  }
  // The impostor never saw a member it trusts: it is still waiting.
  EXPECT_FALSE(impostor->Wait(absl::ZeroDuration()).ok());
  EXPECT_THAT(impostor->LogTail(50), ::testing::HasSubstr("waiting until 8 members are known"));
  process::ExitStatus stopped = impostor->Stop(absl::Seconds(10));  // SIGTERM while waiting
  EXPECT_TRUE(stopped.success()) << stopped.ToString() << "\n" << impostor->LogTail();

  int saw_impostor = 0;
  for (int i = 0; i < kPeers; ++i) {
    const std::string report = ReadFile(absl::StrCat(dir, "/", names[i], ".json"));
    SCOPED_TRACE(names[i] + ": " + report);
    EXPECT_THAT(report, ::testing::HasSubstr("\"ok\": true"));
    EXPECT_EQ(ReportNumber(report, "steps"), 60);
    EXPECT_EQ(ReportNumber(report, "members"), kPeers);  // the eight, the impostor not
    EXPECT_GT(ReportNumber(report, "fetches"), 0);
    EXPECT_EQ(ReportNumber(report, "total"), 200);
    // The coordinator-run gossip test's bar (gossip_cluster_test.cc).
    EXPECT_GT(ReportNumber(report, "accuracy"), 0.6);
    const std::string log = ReadFile(absl::StrCat(dir, "/", names[i], ".log"));
    if (absl::StrContains(log, "certificate not trusted")) ++saw_impostor;
  }
  // The impostor's announcement reached the DHT and was refused.
  EXPECT_GT(saw_impostor, 0);
}

}  // namespace
}  // namespace shoal::testing
