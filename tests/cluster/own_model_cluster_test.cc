// Bring your own model and data, with real processes: a TorchScript model exported by PyTorch
// trains in every mode and comes back as a TorchScript file PyTorch loads; a peer holding another
// copy of the model refuses the task; peers train on their own CSV files (standardised with the
// federation's statistics, in three modes; added up masked with secure aggregation in
// federated-sync and decentralized) and image
// folders (written by shoal-example-data).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/common/file_digest.h"
#include "libs/common/status_macros.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  auto dir = MakeTestTempDir("shoal-own-");
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *dir;
}

std::string ModelsDir() {
  const char* dir = std::getenv("SHOAL_TEST_MODELS");
  return dir != nullptr ? dir : "build/tests/models";
}

std::string BinDir() {
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  return bin != nullptr ? bin : "build/bin";
}

// Runs `binary args` to completion (at most `timeout`); returns its exit status and output.
struct Ran {
  bool ok = false;
  std::string output;
};
Ran RunTool(const std::string& dir, const std::string& name, const std::string& binary,
            std::vector<std::string> args, absl::Duration timeout = absl::Minutes(2)) {
  process::ProcessOptions options;
  options.name = name;
  options.binary = binary;
  options.args = std::move(args);
  options.log_path = dir + "/" + name + ".log";
  Ran ran;
  auto p = process::Process::Start(std::move(options));
  if (!p.ok()) {
    ran.output = std::string(p.status().message());
    return ran;
  }
  auto exit = (*p)->Wait(timeout);
  ran.output = process::TailFile(dir + "/" + name + ".log", 60);
  ran.ok = exit.ok() && exit->success();
  return ran;
}

common::v1::TaskSpec ScriptTask(const std::string& name, common::v1::Mode mode,
                                const std::string& file) {
  common::v1::TaskSpec spec = SmallTask(name);
  spec.set_mode(mode);
  spec.set_model("torchscript");
  spec.mutable_torchscript()->set_file(file);
  absl::StatusOr<std::string> digest = Sha256File(ModelsDir() + "/" + file);
  EXPECT_TRUE(digest.ok()) << digest.status();
  spec.mutable_torchscript()->set_sha256(digest.ok() ? *digest : "");
  spec.set_rounds(3);
  if (mode == common::v1::MODE_DECENTRALIZED) spec.set_max_connection_retry(3);
  if (mode == common::v1::MODE_GOSSIP) {
    spec.mutable_gossip()->set_fetch_probability(0.5);
    spec.mutable_gossip()->set_timeout_ms(2000);
  }
  return spec;
}

// A cluster shared by the cases of one suite, one per mode, each running its own task on it one
// after another: `Start` brings it up once for the suite (a failure fails every case, with the
// services' log tails).
template <absl::Status (*Start)(Cluster&)>
class SharedClusterModes : public ::testing::TestWithParam<common::v1::Mode> {
 protected:
  static void SetUpTestSuite() {
    cluster_ = std::make_unique<Cluster>(TempDir());
    started_ = Start(*cluster_);
    if (!started_.ok()) {
      started_ = absl::InternalError(absl::StrCat(started_.ToString(), "\n", cluster_->LogTails()));
    }
  }
  static void TearDownTestSuite() { cluster_.reset(); }
  static inline std::unique_ptr<Cluster> cluster_;
  static inline absl::Status started_;
};

// A coordinator, an aggregator for federated-sync and two peers for the three modes.
absl::Status StartTorchScriptCluster(Cluster& cluster) {
  SHOAL_RETURN_IF_ERROR(cluster.StartCoordinator());
  SHOAL_RETURN_IF_ERROR(cluster.StartAggregator());
  SHOAL_RETURN_IF_ERROR(cluster.StartPeers(0, 2, 2, {"--model-dir=" + ModelsDir()}));
  return cluster.WaitForPeersConnected(2, absl::Seconds(30));
}
class TorchScriptModes : public SharedClusterModes<&StartTorchScriptCluster> {};

TEST_P(TorchScriptModes, AnExportedModelTrainsAndComesBackAsTorchScript) {
  const common::v1::Mode mode = GetParam();
  ASSERT_TRUE(started_.ok()) << started_;
  Cluster& cluster = *cluster_;
  // Federated-sync trains the CNN with batch normalisation: its running statistics travel
  // through the aggregator with the parameters and reach the exported file.
  const std::string file =
      mode == common::v1::MODE_FEDERATED_SYNC ? "fashion_cnn.pt" : "fashion_mlp.pt";
  const common::v1::TaskSpec spec =
      ScriptTask(mode == common::v1::MODE_FEDERATED_SYNC  ? "ts-federated"
                 : mode == common::v1::MODE_DECENTRALIZED ? "ts-decentralized"
                                                          : "ts-gossip",
                 mode, file);
  absl::Status created = cluster.CreateTask(spec);
  ASSERT_TRUE(created.ok()) << created;
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(4), "task completion");
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  ASSERT_GT(status->history_size(), 0);
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  if (mode != common::v1::MODE_GOSSIP) {
    EXPECT_GT(last.test_accuracy(), 0.6) << last.ShortDebugString();
  }
  if (mode != common::v1::MODE_FEDERATED_SYNC) return;

  // The trained model, as the task's TorchScript file with the trained weights and batch-norm
  // statistics, loads in PyTorch and differs from the exported one in both.
  const std::string out = cluster.dir() + "/trained.pt";
  Ran get = RunTool(
      cluster.dir(), "model-get", BinDir() + "/shoalctl",
      {"--coordinator", cluster.coordinator().address, "--tls-dir", cluster.ClientTlsDir(), "model",
       "get", spec.name(), "--format", "torchscript", "--model-dir", ModelsDir(), "--out", out});
  ASSERT_TRUE(get.ok) << get.output;
  EXPECT_THAT(get.output, HasSubstr("as TorchScript"));
  Ran check = RunTool(cluster.dir(), "pytorch", "/usr/bin/python3",
                      {"-c",
                       "import sys, torch\n"
                       "m = torch.jit.load(sys.argv[1]); o = torch.jit.load(sys.argv[2])\n"
                       "assert tuple(m(torch.zeros(3, 1, 28, 28)).shape) == (3, 10)\n"
                       "d = sum(float((a - b).abs().sum()) for a, b in zip(m.parameters(), "
                       "o.parameters()))\n"
                       "assert d > 0, d\n"
                       "mb, ob = dict(m.named_buffers()), dict(o.named_buffers())\n"
                       "v = float((mb['bn1.running_var'] - ob['bn1.running_var']).abs().sum())\n"
                       "assert v > 0, 'batch-norm statistics not carried'\n"
                       "print('pytorch loaded the trained model, distance', d, 'statistics', v)\n",
                       out, ModelsDir() + "/" + file});
  EXPECT_TRUE(check.ok) << check.output;
  EXPECT_THAT(check.output, HasSubstr("pytorch loaded the trained model"));
}

INSTANTIATE_TEST_SUITE_P(Modes, TorchScriptModes,
                         ::testing::Values(common::v1::MODE_FEDERATED_SYNC,
                                           common::v1::MODE_DECENTRALIZED, common::v1::MODE_GOSSIP),
                         [](const ::testing::TestParamInfo<common::v1::Mode>& info) {
                           return std::string(
                               info.param == common::v1::MODE_FEDERATED_SYNC  ? "FederatedSync"
                               : info.param == common::v1::MODE_DECENTRALIZED ? "Decentralized"
                                                                              : "Gossip");
                         });

TEST(OwnModelClusterTest, APeerWithAnotherCopyOfTheModelRefusesNamingBothDigests) {
  Cluster cluster(TempDir());
  const std::string other = cluster.dir() + "/other-models";
  std::filesystem::create_directories(other);
  std::filesystem::copy_file(ModelsDir() + "/fashion_cnn.pt", other + "/fashion_mlp.pt");
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartAggregator().ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.StartPeer(0, 1, {"--model-dir=" + other}).ok()) << cluster.LogTails();
  ASSERT_TRUE(cluster.WaitForPeersConnected(1, absl::Seconds(30)).ok());
  common::v1::TaskSpec spec =
      ScriptTask("ts-mismatch", common::v1::MODE_FEDERATED_SYNC, "fashion_mlp.pt");
  spec.set_min_participants(1);
  absl::Status created = cluster.CreateTask(spec);
  ASSERT_TRUE(created.ok()) << created;
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_FAILED; },
      absl::Minutes(1), "the task failing");
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  EXPECT_THAT(status->message(),
              AllOf(HasSubstr(spec.torchscript().sha256()),
                    HasSubstr(*Sha256File(other + "/fashion_mlp.pt")), HasSubstr("SHA-256")));
  EXPECT_TRUE(cluster.peer(0).process->Running()) << "a refused task must not end the peer";
}

// Writes the example data sets of `kind` (tabular, images) for `peers` peers into DIR/<kind>.
void MakeExampleData(const std::string& dir, const std::string& kind, int peers = 2) {
  Ran made = RunTool(
      dir, "example-data", BinDir() + "/shoal-example-data",
      {"--out", dir, "--peers", absl::StrCat(peers), "--kind", kind, "--images-per-peer", "400"});
  ASSERT_TRUE(made.ok) << made.output;
}

// Starts a coordinator, an aggregator and `peers` peers whose data are DATA/peer-0,
// DATA/peer-1...
absl::Status StartOwnData(Cluster& cluster, const std::string& data, int peers = 2) {
  SHOAL_RETURN_IF_ERROR(cluster.StartCoordinator());
  SHOAL_RETURN_IF_ERROR(cluster.StartAggregator());
  for (int i = 0; i < peers; ++i) {
    SHOAL_RETURN_IF_ERROR(cluster.StartOwnDataPeer(i, absl::StrCat(data, "/peer-", i),
                                                   {"--model-dir=" + ModelsDir()}));
  }
  return cluster.WaitForPeersConnected(peers, absl::Seconds(30));
}

// Runs `spec` on the cluster; returns the final status.
absl::StatusOr<cv1::TaskStatus> RunTask(Cluster& cluster, const common::v1::TaskSpec& spec) {
  SHOAL_RETURN_IF_ERROR(cluster.CreateTask(spec));
  return cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(4), "task completion");
}

// Runs `spec` on a new cluster of `peers` peers whose data are DATA/peer-0, DATA/peer-1...;
// returns the final status.
absl::StatusOr<cv1::TaskStatus> RunOwnData(Cluster& cluster, const std::string& data,
                                           const common::v1::TaskSpec& spec, int peers = 2) {
  SHOAL_RETURN_IF_ERROR(StartOwnData(cluster, data, peers));
  return RunTask(cluster, spec);
}

// The mean of column `column` over the CSV files `paths` pooled (plain comma-separated numbers,
// a header row first, as shoal-example-data writes them) and their rows.
std::pair<double, uint64_t> PooledColumnMean(const std::vector<std::string>& paths,
                                             const std::string& column) {
  double sum = 0;
  uint64_t rows = 0;
  for (const std::string& path : paths) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    std::vector<std::string> header = absl::StrSplit(line, ',');
    const size_t at =
        static_cast<size_t>(std::find(header.begin(), header.end(), column) - header.begin());
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      std::vector<std::string> cells = absl::StrSplit(line, ',');
      if (at < cells.size()) sum += std::stod(cells[at]);
      ++rows;
    }
  }
  return {rows > 0 ? sum / static_cast<double>(rows) : 0, rows};
}

// The machine-condition table of shoal-example-data, standardised with the federation's
// statistics (the default), trained by the exported TorchScript MLP.
common::v1::TaskSpec CsvTask(const std::string& name) {
  common::v1::TaskSpec spec = SmallTask(name);
  spec.set_model("torchscript");
  spec.mutable_torchscript()->set_file("tabular_mlp.pt");
  spec.mutable_torchscript()->set_sha256(*Sha256File(ModelsDir() + "/tabular_mlp.pt"));
  spec.clear_dataset();
  auto& d = *spec.mutable_dataset();
  d.set_partition(common::v1::PARTITION_IID);
  d.set_name("machine-condition");
  d.set_format(common::v1::DATA_FORMAT_CSV);
  d.set_train("train.csv");
  d.set_test("test.csv");
  d.set_label_column("condition");
  for (const char* f : {"temperature", "pressure", "vibration", "rpm", "current", "humidity",
                        "noise_db", "oil_hours"}) {
    d.add_feature_columns(f);
  }
  for (const char* c : {"normal", "worn", "overheating", "misaligned"}) d.add_classes(c);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_round_batches(40);
  spec.set_rounds(5);
  return spec;
}

// Every peer's moments were added up: the statistics are those of the peers' tables pooled
// (1,500 training rows each), and every peer standardised with them.
void ExpectFederationStatistics(Cluster& cluster, const cv1::TaskStatus& status, int peers = 2) {
  ASSERT_TRUE(status.has_statistics()) << status.ShortDebugString();
  const common::v1::FederationStatistics& stats = status.statistics();
  std::vector<std::string> ids, files;
  for (int i = 0; i < peers; ++i) {
    ids.push_back(absl::StrCat("peer-", i));
    files.push_back(absl::StrCat(cluster.dir(), "/tabular/peer-", i, "/train.csv"));
  }
  EXPECT_THAT(stats.peers(), ::testing::ElementsAreArray(ids));
  const uint64_t samples = 1500u * static_cast<uint64_t>(peers);
  EXPECT_EQ(stats.samples(), samples);
  ASSERT_EQ(stats.mean_size(), 8);
  ASSERT_EQ(stats.std_size(), 8);
  const auto [rpm, rows] = PooledColumnMean(files, "rpm");  // feature 3
  EXPECT_EQ(rows, samples);
  EXPECT_NEAR(stats.mean(3), rpm, 1e-3 * rpm);
  for (const std::string& id : ids) {
    EXPECT_THAT(process::TailFile(absl::StrCat(cluster.dir(), "/", id, ".log"), 400),
                HasSubstr(absl::StrCat("task ", status.spec().name(),
                                       ": standardised with the federation's statistics (", samples,
                                       " training samples of ", peers, " peers)")))
        << id;
  }
}

// Each peer's own CSV table (string labels, features of very different scales, each peer's
// classes skewed), standardised by every peer with the federation's statistics, which with
// secure aggregation are added up masked (three peers: the fewest a masking takes). The
// coordinator got only mask keys, masked moments and self-mask seeds: its log says it masked,
// and its status holds the statistics and each peer's counts, nothing of one peer's moments.
// (The plain path runs in the other modes below.)
TEST(OwnDataClusterTest, PeersTrainATorchScriptModelOnTheirOwnCsvFiles) {
  Cluster cluster(TempDir());
  MakeExampleData(cluster.dir(), "tabular", 3);
  common::v1::TaskSpec spec = CsvTask("own-csv");
  spec.set_min_participants(3);
  auto& sa = *spec.mutable_privacy()->mutable_secure_aggregation();
  sa.set_clip_norm(10);
  sa.set_feature_bound(1e6);
  absl::StatusOr<cv1::TaskStatus> status = RunOwnData(cluster, cluster.dir() + "/tabular", spec, 3);
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  // Well above chance (4 classes): 0.696 after the 5 rounds on three peers' tables.
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_GT(last.test_accuracy(), 0.6) << last.ShortDebugString();
  // The coordinator saw each peer's counts of its own files, never the data.
  ASSERT_EQ(status->data_size(), 3);
  for (const cv1::PeerData& p : status->data()) {
    EXPECT_EQ(p.train_samples(), 1500u) << p.peer_id();
    EXPECT_EQ(p.test_samples(), 400u) << p.peer_id();
    ASSERT_EQ(p.label_histogram_size(), 4) << p.peer_id();
  }
  ExpectFederationStatistics(cluster, *status, 3);
  const std::string log = process::TailFile(cluster.dir() + "/coordinator.log", 2000);
  EXPECT_THAT(log, HasSubstr("secure statistics attempt 0: masking among 3 peers"));
  EXPECT_THAT(log, Not(HasSubstr("data moments of")));  // the plain path's count of peers
}

// The other modes join a task the same way: their peers wait for the same statistics. One
// cluster of three peers (the fewest a masking takes) for both modes, a task of each one after
// the other. The decentralized task has secure aggregation, so the coordinator adds up their
// moments masked, as in federated-sync above; gossip takes none, so its peers' moments go in
// the clear.
constexpr int kCsvPeers = 3;
absl::Status StartCsvCluster(Cluster& cluster) {
  MakeExampleData(cluster.dir(), "tabular", kCsvPeers);
  return StartOwnData(cluster, cluster.dir() + "/tabular", kCsvPeers);
}
class OwnCsvModes : public SharedClusterModes<&StartCsvCluster> {};

TEST_P(OwnCsvModes, EveryPeerStandardisesWithTheFederationStatistics) {
  ASSERT_TRUE(started_.ok()) << started_;
  Cluster& cluster = *cluster_;
  const bool secure = GetParam() == common::v1::MODE_DECENTRALIZED;
  const int peers = kCsvPeers;
  common::v1::TaskSpec spec = CsvTask(secure ? "own-csv-decentralized" : "own-csv-gossip");
  spec.set_min_participants(peers);
  spec.set_mode(GetParam());
  spec.set_rounds(3);
  if (secure) {
    spec.set_max_connection_retry(3);
    auto& sa = *spec.mutable_privacy()->mutable_secure_aggregation();
    sa.set_clip_norm(10);
    sa.set_feature_bound(1e6);
  }
  if (GetParam() == common::v1::MODE_GOSSIP) {
    spec.mutable_gossip()->set_fetch_probability(0.5);
    spec.mutable_gossip()->set_timeout_ms(2000);
  }
  absl::StatusOr<cv1::TaskStatus> status = RunTask(cluster, spec);
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  ExpectFederationStatistics(cluster, *status, peers);
  const std::string log = process::TailFile(cluster.dir() + "/coordinator.log", 2000);
  // The coordinator's log holds both tasks: each check names its task.
  const std::string task = absl::StrCat("task ", spec.name(), ": ");
  if (secure) {
    EXPECT_THAT(log, HasSubstr(task + "secure statistics attempt"));
    EXPECT_THAT(log, ContainsRegex("secure statistics attempt [0-9]+: masking among 3 peers"));
    EXPECT_THAT(log, Not(HasSubstr(task + "data moments of")));
  } else {
    EXPECT_THAT(log, HasSubstr(task + "data moments of"));
    EXPECT_THAT(log, Not(HasSubstr(task + "secure statistics")));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OwnCsvModes,
                         ::testing::Values(common::v1::MODE_DECENTRALIZED, common::v1::MODE_GOSSIP),
                         [](const ::testing::TestParamInfo<common::v1::Mode>& info) {
                           return std::string(info.param == common::v1::MODE_DECENTRALIZED
                                                  ? "Decentralized"
                                                  : "Gossip");
                         });

// Each peer's own PNG folders, trained by the built-in CNN, standardised with the federation's
// per-channel statistics (normalization standardize without mean/std).
TEST(OwnDataClusterTest, PeersTrainOnTheirOwnImageFolders) {
  Cluster cluster(TempDir());
  MakeExampleData(cluster.dir(), "images");
  common::v1::TaskSpec spec = SmallTask("own-images");
  spec.set_model("cnn");
  spec.clear_dataset();
  auto& d = *spec.mutable_dataset();
  d.set_partition(common::v1::PARTITION_IID);
  d.set_format(common::v1::DATA_FORMAT_IMAGE_FOLDER);
  d.set_train("train");
  d.set_test("test");
  for (const char* c : {"t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                        "sneaker", "bag", "ankle-boot"}) {
    d.add_classes(c);
  }
  d.add_image_size(28);
  d.set_channels(1);
  d.set_normalization(common::v1::NORMALIZATION_STANDARDIZE);
  spec.set_round_batches(12);
  spec.set_rounds(4);
  absl::StatusOr<cv1::TaskStatus> status = RunOwnData(cluster, cluster.dir() + "/images", spec);
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << cluster.LogTails();
  const cv1::RoundSummary& last = status->history(status->history_size() - 1);
  EXPECT_GT(last.test_accuracy(), 0.5) << last.ShortDebugString();
  ASSERT_EQ(status->data_size(), 2);
  for (const cv1::PeerData& p : status->data()) {
    EXPECT_EQ(p.train_samples(), 400u) << p.peer_id();
    EXPECT_EQ(p.test_samples(), 200u) << p.peer_id();
  }
  // Fashion-MNIST's pixels: mean 0.286, std 0.353 over the whole training set.
  ASSERT_TRUE(status->has_statistics()) << status->ShortDebugString();
  const common::v1::FederationStatistics& stats = status->statistics();
  EXPECT_EQ(stats.samples(), 800u);
  ASSERT_EQ(stats.mean_size(), 1);
  ASSERT_EQ(stats.std_size(), 1);
  EXPECT_NEAR(stats.mean(0), 0.286, 0.03);
  EXPECT_NEAR(stats.std(0), 0.353, 0.03);
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(process::TailFile(absl::StrCat(cluster.dir(), "/peer-", i, ".log"), 400),
                HasSubstr("standardised with the federation's statistics (800 training samples "
                          "of 2 peers)"))
        << "peer-" << i;
  }
}

}  // namespace
}  // namespace shoal::testing
