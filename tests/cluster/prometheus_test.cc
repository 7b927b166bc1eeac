// A real Prometheus server (Debian's `prometheus` package) scrapes a running local cluster: a
// coordinator, an aggregator and two peers training a small task. Through Prometheus' HTTP API
// every target is up and the coordinator's completed rounds are visible.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/status.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace cv1 = coordinator::v1;
using google::protobuf::Struct;
using google::protobuf::Value;

std::string PrometheusBinary() {
  const char* binary = std::getenv("SHOAL_PROMETHEUS");
  return binary != nullptr ? binary : "/usr/bin/prometheus";
}

// A port that was free a moment ago (bind to 0, read it back, release it).
absl::StatusOr<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return absl::InternalError("bind failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// One query result: the series' labels and its value as Prometheus prints it ("1", "6", ...).
struct Sample {
  std::map<std::string, std::string> labels;
  std::string value;
};

const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

// GET /api/v1/query?query=QUERY (an instant vector query) and its samples.
absl::StatusOr<std::vector<Sample>> Query(const std::string& prometheus, const std::string& query) {
  absl::StatusOr<std::string> body = HttpGet(prometheus, "/api/v1/query?query=" + query);
  if (!body.ok()) return body.status();
  Struct response;
  if (!google::protobuf::util::JsonStringToMessage(*body, &response).ok()) {
    return absl::DataLossError("not JSON: " + *body);
  }
  const Value* status = Field(response, "status");
  const Value* data = Field(response, "data");
  if (status == nullptr || status->string_value() != "success" || data == nullptr) {
    return absl::InternalError("query " + query + " failed: " + *body);
  }
  const Value* type = Field(data->struct_value(), "resultType");
  const Value* result = Field(data->struct_value(), "result");
  if (type == nullptr || type->string_value() != "vector" || result == nullptr) {
    return absl::DataLossError("not an instant vector: " + *body);
  }
  std::vector<Sample> samples;
  for (const Value& series : result->list_value().values()) {
    Sample sample;
    const Value* metric = Field(series.struct_value(), "metric");
    const Value* value = Field(series.struct_value(), "value");  // [unix time, "value"]
    if (metric == nullptr || value == nullptr || value->list_value().values_size() != 2) {
      return absl::DataLossError("malformed sample in " + *body);
    }
    for (const auto& [name, label] : metric->struct_value().fields()) {
      sample.labels[name] = label.string_value();
    }
    sample.value = value->list_value().values(1).string_value();
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::string Describe(const std::vector<Sample>& samples) {
  std::vector<std::string> lines;
  for (const Sample& s : samples) {
    lines.push_back(absl::StrCat(s.labels.count("instance") ? s.labels.at("instance") : "?", " ",
                                 s.labels.count("job") ? s.labels.at("job") : "?", " = ", s.value));
  }
  return absl::StrJoin(lines, "; ");
}

// A Prometheus server on 127.0.0.1 scraping `jobs` (job name -> targets) every second.
class PrometheusServer {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::map<std::string, std::vector<std::string>>& jobs) {
    const std::string config_path = dir + "/prometheus.yml";
    {
      std::ofstream config(config_path);
      config << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
             << "  evaluation_interval: 1s\nscrape_configs:\n";
      for (const auto& [job, targets] : jobs) {
        config << "  - job_name: " << job << "\n    static_configs:\n      - targets: [\""
               << absl::StrJoin(targets, "\", \"") << "\"]\n";
      }
      if (!config.good()) return absl::InternalError("cannot write " + config_path);
    }
    absl::Status last = absl::UnknownError("not started");
    // The free port may be taken between FreePort() and Prometheus binding it: retry.
    for (int attempt = 0; attempt < 3; ++attempt) {
      absl::StatusOr<int> port = FreePort();
      if (!port.ok()) return port.status();
      auto server = std::unique_ptr<PrometheusServer>(new PrometheusServer);
      server->address_ = absl::StrCat("127.0.0.1:", *port);
      process::ProcessOptions options;
      options.name = "prometheus";
      options.binary = PrometheusBinary();
      options.args = {"--config.file=" + config_path,
                      absl::StrCat("--storage.tsdb.path=", dir, "/tsdb-", attempt),
                      "--web.listen-address=" + server->address_, "--log.level=warn"};
      options.log_path = dir + "/prometheus.log";
      auto proc = process::Process::Start(std::move(options));
      if (!proc.ok()) return proc.status();
      server->process_ = *std::move(proc);
      last = server->WaitReady(absl::Seconds(30));
      if (last.ok()) return server;
      server->process_->Stop(absl::Seconds(5));
    }
    return last;
  }

  ~PrometheusServer() {
    if (process_) process_->Stop(absl::Seconds(10));
  }

  const std::string& address() const { return address_; }
  process::Process& process() { return *process_; }

 private:
  PrometheusServer() = default;

  absl::Status WaitReady(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (!process_->Running()) {
        return absl::FailedPreconditionError("prometheus exited:\n" + process_->LogTail(20));
      }
      absl::StatusOr<std::string> ready = HttpGet(address_, "/-/ready");
      if (ready.ok() && ready->find("Ready") != std::string::npos) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return absl::DeadlineExceededError("prometheus not ready:\n" + process_->LogTail(20));
  }

  std::string address_;
  std::unique_ptr<process::Process> process_;
};

TEST(PrometheusTest, ScrapesEveryServiceOfARunningCluster) {
  ASSERT_EQ(::access(PrometheusBinary().c_str(), X_OK), 0)
      << PrometheusBinary() << " not found: install Debian's prometheus package";
  auto dir = MakeTestTempDir("shoal-prometheus-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  Cluster cluster(*dir);
  {
    absl::Status started = cluster.StartCoordinator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  {
    absl::Status started = cluster.StartAggregator();
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }
  {
    absl::Status started = cluster.StartPeers(0, 2, 2);
    ASSERT_TRUE(started.ok()) << started << "\n" << cluster.LogTails();
  }

  // The same job names as deploy/prometheus/prometheus.yml.
  const std::map<std::string, std::vector<std::string>> jobs = {
      {"shoal-coordinator", {cluster.coordinator().metrics_address}},
      {"shoal-aggregator", {cluster.aggregator().metrics_address}},
      {"shoal-peer", {cluster.peer(0).metrics_address, cluster.peer(1).metrics_address}},
  };
  auto prometheus = PrometheusServer::Start(*dir, jobs);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  const std::string api = (*prometheus)->address();

  ASSERT_TRUE(cluster.WaitForPeersConnected(2, absl::Seconds(30)).ok());
  common::v1::TaskSpec spec = SmallTask("fmnist-prometheus");
  spec.set_rounds(3);
  {
    absl::Status created = cluster.CreateTask(spec);
    ASSERT_TRUE(created.ok()) << created;
  }
  auto status = cluster.WaitFor(
      spec.name(), [](const cv1::TaskStatus& s) { return s.state() == cv1::TASK_STATE_COMPLETED; },
      absl::Minutes(3), "task completion");
  ASSERT_TRUE(status.ok()) << status.status();

  // Every target is up: one `up` series per target, each 1.
  std::map<std::string, std::string> want_job;  // instance -> job
  for (const auto& [job, targets] : jobs) {
    for (const std::string& target : targets) want_job[target] = job;
  }
  absl::StatusOr<std::vector<Sample>> up;
  const absl::Time up_deadline = absl::Now() + absl::Seconds(30);
  auto all_up = [&](const std::vector<Sample>& samples) {
    if (samples.size() != want_job.size()) return false;
    for (const Sample& s : samples) {
      if (s.value != "1") return false;
    }
    return true;
  };
  do {
    up = Query(api, "up");
    if (up.ok() && all_up(*up)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (absl::Now() < up_deadline);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_EQ(up->size(), want_job.size()) << Describe(*up);
  for (const Sample& s : *up) {
    const std::string instance = s.labels.count("instance") ? s.labels.at("instance") : "";
    ASSERT_TRUE(want_job.count(instance)) << "unexpected target " << instance;
    EXPECT_EQ(s.labels.at("job"), want_job.at(instance)) << instance;
    EXPECT_EQ(s.value, "1") << instance << " (" << want_job.at(instance) << ") is down\n"
                            << (*prometheus)->process().LogTail(10);
  }

  // The training shows: the coordinator's rounds as scraped after the task completed.
  const std::string rounds_metric = "shoal_coordinator_rounds_completed_total";
  const std::string want_rounds = absl::StrCat(spec.rounds());
  absl::StatusOr<std::vector<Sample>> rounds;
  const absl::Time rounds_deadline = absl::Now() + absl::Seconds(30);
  do {
    rounds = Query(api, rounds_metric);
    if (rounds.ok() && rounds->size() == 1 && (*rounds)[0].value == want_rounds) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (absl::Now() < rounds_deadline);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u) << Describe(*rounds);
  EXPECT_EQ((*rounds)[0].labels.at("instance"), cluster.coordinator().metrics_address);
  double value = 0;
  ASSERT_TRUE(absl::SimpleAtod((*rounds)[0].value, &value)) << (*rounds)[0].value;
  EXPECT_GT(value, 0);
  EXPECT_EQ((*rounds)[0].value, want_rounds);

  // The peers' training metrics arrive too (label-free gauge, one series per peer).
  auto accuracy = Query(api, "shoal_peer_test_accuracy");
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  EXPECT_EQ(accuracy->size(), 2u) << Describe(*accuracy);

  // Prometheus stops cleanly on SIGTERM.
  process::ExitStatus exit = (*prometheus)->process().Stop(absl::Seconds(10));
  EXPECT_TRUE(exit.success()) << exit.ToString() << "\n" << (*prometheus)->process().LogTail(10);
}

}  // namespace
}  // namespace shoal::testing
