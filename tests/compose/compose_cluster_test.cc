// Runs docker-compose.yml's services as plain processes on 127.0.0.1, with the exact commands,
// health checks, volumes and start order of the compose file, so its wiring (ports, flags,
// certificates, volumes, dependencies) is exercised without a Docker engine:
//   - every compose service name resolves to 127.0.0.1 and every container port of a service
//     gets its own free host port (HOST:PORT arguments are rewritten consistently);
//   - named volumes become temp directories, ./ bind mounts the source tree, the image's
//     `COPY deploy/tasks/ /etc/shoal/tasks/` a temp copy of the tasks cut down to stay fast;
//   - programs come from SHOAL_BIN_DIR (the image copies build/bin to /usr/local/bin);
//   - services start in file order once their depends_on conditions hold (completed
//     successfully / healthy by their own health check), non-Shoal images are skipped.
// Then the compose `shoalctl` entrypoint watches the default task to completion.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "services/shoalctl/process.h"
#include "tests/compose/compose_file.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kTask[] = "fashion-mnist-cnn";

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// A port nothing listens on right now (bound and released).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("bind failed");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Maps one compose project onto this machine.
class ComposeHost {
 public:
  ComposeHost(const ComposeFile& compose, std::string dir, std::string source_dir)
      : compose_(compose), dir_(std::move(dir)), source_dir_(std::move(source_dir)) {
    for (const ComposeService& s : compose_.services) names_.insert(s.name);
  }

  // `arg` of service `service` as a plain process sees it.
  absl::StatusOr<std::string> Rewrite(const std::string& service, const std::string& arg) {
    // --flag=VALUE: rewrite the value.
    if (absl::StartsWith(arg, "--") && arg.find('=') != std::string::npos) {
      const size_t eq = arg.find('=');
      absl::StatusOr<std::string> value = Rewrite(service, arg.substr(eq + 1));
      if (!value.ok()) return value.status();
      return absl::StrCat(arg.substr(0, eq + 1), *value);
    }
    static const std::regex host_port(R"(^([A-Za-z0-9.-]+):([0-9]+)$)");
    std::smatch m;
    if (std::regex_match(arg, m, host_port)) {
      const std::string host = m[1];
      const int port = std::stoi(m[2]);
      std::string owner;
      if (host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost") {
        owner = service;  // its own port
      } else if (names_.count(host) > 0) {
        owner = host;
      } else {
        return arg;
      }
      absl::StatusOr<int> mapped = Port(owner, port);
      if (!mapped.ok()) return mapped.status();
      return absl::StrCat("127.0.0.1:", *mapped);
    }
    // Container paths: the service's volumes first, then the image's files.
    const ComposeService* s = compose_.Find(service);
    for (const std::string& volume : s->volumes) {
      std::vector<std::string> parts = absl::StrSplit(volume, ':');
      if (parts.size() < 2) continue;
      const std::string& target = parts[1];
      if (arg != target && !absl::StartsWith(arg, target + "/")) continue;
      std::string host;
      if (absl::StartsWith(parts[0], "./") || absl::StartsWith(parts[0], "/")) {
        host = absl::StartsWith(parts[0], "./") ? source_dir_ + parts[0].substr(1) : parts[0];
      } else {
        host = absl::StrCat(dir_, "/volumes/", parts[0]);
        fs::create_directories(host);
      }
      return host + arg.substr(target.size());
    }
    for (const auto& [target, host] : image_paths_) {
      if (arg == target || absl::StartsWith(arg, target + "/")) {
        return host + arg.substr(target.size());
      }
    }
    return arg;
  }

  absl::StatusOr<std::vector<std::string>> RewriteAll(const std::string& service,
                                                      const std::vector<std::string>& argv) {
    std::vector<std::string> out;
    for (const std::string& a : argv) {
      absl::StatusOr<std::string> r = Rewrite(service, a);
      if (!r.ok()) return r.status();
      out.push_back(*r);
    }
    return out;
  }

  void AddImagePath(const std::string& container, const std::string& host) {
    image_paths_[container] = host;
  }

  // Starts `argv` (rewritten) as `name`; the program comes from the bin dir.
  absl::StatusOr<std::unique_ptr<process::Process>> Start(const std::string& service,
                                                          const std::string& name,
                                                          const std::vector<std::string>& argv) {
    absl::StatusOr<std::vector<std::string>> rewritten = RewriteAll(service, argv);
    if (!rewritten.ok()) return rewritten.status();
    if (rewritten->empty()) return absl::InvalidArgumentError(service + " runs nothing");
    std::cerr << name << ": " << absl::StrJoin(*rewritten, " ") << "\n";
    process::ProcessOptions options;
    options.name = name;
    options.binary = Env("SHOAL_BIN_DIR", "build/bin") + "/" + (*rewritten)[0];
    options.args.assign(rewritten->begin() + 1, rewritten->end());
    options.log_path = absl::StrCat(dir_, "/logs/", name, ".log");
    const ComposeService* s = compose_.Find(service);
    options.env = s->environment;
    return process::Process::Start(std::move(options));
  }

  // Runs `argv` of `service` to the end; OK when it exits 0.
  absl::Status RunOnce(const std::string& service, const std::string& name,
                       const std::vector<std::string>& argv, absl::Duration timeout) {
    auto proc = Start(service, name, argv);
    if (!proc.ok()) return proc.status();
    absl::StatusOr<process::ExitStatus> exit = (*proc)->Wait(timeout);
    if (!exit.ok())
      return absl::DeadlineExceededError(absl::StrCat(
          name, " still runs after ", absl::FormatDuration(timeout), "\n", (*proc)->LogTail(10)));
    if (!exit->success()) {
      return absl::InternalError(
          absl::StrCat(name, " ended with ", exit->ToString(), ":\n", (*proc)->LogTail(10)));
    }
    return absl::OkStatus();
  }

  // Runs the service's health check until it passes (compose: `service_healthy`).
  absl::Status WaitHealthy(const std::string& service, absl::Duration timeout) {
    const ComposeService* s = compose_.Find(service);
    if (s->healthcheck.empty()) {
      return absl::FailedPreconditionError(service + " has no health check");
    }
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status last;
    for (int attempt = 0; absl::Now() < deadline; ++attempt) {
      last = RunOnce(service, absl::StrCat(service, "-health"), s->healthcheck, absl::Seconds(10));
      if (last.ok()) return last;
      absl::SleepFor(absl::Milliseconds(300));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        service, " is not healthy after ", absl::FormatDuration(timeout), ": ", last.message()));
  }

  const std::map<std::pair<std::string, int>, int>& ports() const { return ports_; }

 private:
  absl::StatusOr<int> Port(const std::string& service, int container_port) {
    auto key = std::make_pair(service, container_port);
    if (auto it = ports_.find(key); it != ports_.end()) return it->second;
    for (int tries = 0; tries < 20; ++tries) {
      absl::StatusOr<int> port = FreePort();
      if (!port.ok()) return port.status();
      if (used_.insert(*port).second) {
        ports_[key] = *port;
        return *port;
      }
    }
    return absl::InternalError("no free port");
  }

  const ComposeFile& compose_;
  const std::string dir_;
  const std::string source_dir_;
  std::set<std::string> names_;
  std::map<std::string, std::string> image_paths_;
  std::map<std::pair<std::string, int>, int> ports_;
  std::set<int> used_;
};

// The repo's task files, cut down so the test stays short.
void WriteReducedTasks(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    YAML::Node task = YAML::LoadFile(entry.path().string());
    task["rounds"] = 2;
    task["round_batches"] = 25;
    task["dataset"]["train_limit"] = 4000;
    task["dataset"]["test_limit"] = 1000;
    std::ofstream out(to + "/" + entry.path().filename().string());
    out << YAML::Dump(task) << "\n";
  }
}

bool IsShoalImage(const ComposeService& s) {
  return s.build || absl::StartsWith(s.image, "shoal:");
}

// Runs the compose file's services (those of `profile` too, when set) as plain processes and
// watches `task` to completion; `daemons` long-running services start.
void RunComposeCluster(const std::string& profile, const std::string& task, size_t daemons) {
  const std::string source_dir = Env("SHOAL_SOURCE_DIR", ".");
  absl::StatusOr<ComposeFile> compose = LoadComposeFile(source_dir + "/docker-compose.yml");
  ASSERT_TRUE(compose.ok()) << compose.status();
  absl::StatusOr<std::vector<DockerStage>> stages = LoadDockerfile(source_dir + "/Dockerfile");
  ASSERT_TRUE(stages.ok()) << stages.status();

  absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-compose-test-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  fs::create_directories(*dir + "/logs");
  ComposeHost host(*compose, *dir, source_dir);
  // The image's own files: COPY SRC DST from the build context (not --from=...).
  for (const DockerInstruction& i : stages->back().instructions) {
    std::vector<std::string> words = Words(i.args);
    if (i.keyword != "COPY" || words.size() != 2 || absl::StartsWith(words[0], "--")) continue;
    std::string target = words[1];
    if (absl::EndsWith(target, "/")) target.pop_back();
    if (words[0] == "deploy/tasks/") {
      WriteReducedTasks(source_dir + "/deploy/tasks", *dir + "/image/tasks");
      host.AddImagePath(target, *dir + "/image/tasks");
    } else {
      host.AddImagePath(target, source_dir + "/" + words[0]);
    }
  }

  // Start in file order, honouring depends_on like compose does.
  std::map<std::string, std::unique_ptr<process::Process>> running;
  std::vector<std::string> started;  // long-running, in start order
  std::set<std::string> completed, healthy;
  const absl::Time begin = absl::Now();
  for (const ComposeService& s : compose->services) {
    if (!IsShoalImage(s)) {
      std::cerr << "skipping " << s.name << " (image " << s.image << ", not Shoal's)\n";
      continue;
    }
    // A profile's services start only on request (the shoalctl tool, `--profile hierarchical`).
    if (!s.profiles.empty() &&
        std::find(s.profiles.begin(), s.profiles.end(), profile) == s.profiles.end()) {
      continue;
    }
    for (const auto& [dep, condition] : s.depends_on) {
      if (condition == "service_completed_successfully") {
        ASSERT_EQ(completed.count(dep), 1u) << s.name << " needs " << dep << " to have completed";
      } else if (condition == "service_healthy" && healthy.count(dep) == 0) {
        ASSERT_EQ(running.count(dep), 1u) << s.name << " needs " << dep << ", not started";
        absl::Status h = host.WaitHealthy(dep, absl::Seconds(60));
        ASSERT_TRUE(h.ok()) << h << "\n" << running[dep]->LogTail(20);
        healthy.insert(dep);
      }
    }
    if (s.restart == "no") {  // one-shot job: certs, task creation
      absl::Status run = host.RunOnce(s.name, s.name, s.Argv(), absl::Seconds(60));
      ASSERT_TRUE(run.ok()) << run;
      completed.insert(s.name);
      continue;
    }
    auto proc = host.Start(s.name, s.name, s.Argv());
    ASSERT_TRUE(proc.ok()) << s.name << ": " << proc.status();
    running[s.name] = *std::move(proc);
    started.push_back(s.name);
  }
  ASSERT_EQ(started.size(), daemons) << absl::StrJoin(started, ", ");
  ASSERT_EQ(completed.count("certs"), 1u);
  for (const std::string& name : started) {
    absl::Status h = host.WaitHealthy(name, absl::Seconds(60));
    ASSERT_TRUE(h.ok()) << h << "\n" << running[name]->LogTail(20);
  }
  std::cerr << "all " << started.size() << " services healthy after "
            << absl::FormatDuration(absl::Now() - begin) << "\n";

  // The compose `shoalctl` tool watches the task until it ends; exit 0 = completed.
  const ComposeService* tool = compose->Find("shoalctl");
  ASSERT_NE(tool, nullptr);
  std::vector<std::string> watch = tool->entrypoint;
  watch.insert(watch.end(), {"task", "watch", task});
  absl::Status watched = host.RunOnce("shoalctl", "shoalctl-watch", watch, absl::Seconds(150));
  std::string tails;
  for (const std::string& name : started) {
    absl::StrAppend(&tails, "--- ", name, "\n", running[name]->LogTail(8));
  }
  ASSERT_TRUE(watched.ok()) << watched << "\n" << tails;
  std::ifstream watch_log(*dir + "/logs/shoalctl-watch.log");
  std::stringstream watch_text;
  watch_text << watch_log.rdbuf();
  EXPECT_TRUE(absl::StrContains(watch_text.str(), "completed")) << watch_text.str();
  std::cerr << watch_text.str();
  std::cerr << "task completed after " << absl::FormatDuration(absl::Now() - begin) << "\n";

  // Its default command (`task list`) works too, and every service is still healthy.
  EXPECT_TRUE(host.RunOnce("shoalctl", "shoalctl-list", tool->Argv(), absl::Seconds(20)).ok());
  if (!profile.empty()) {
    // The task ran on the profile's tree: two clusters below the root, each and the root with a
    // backup.
    std::ifstream log(*dir + "/logs/coordinator.log");
    std::stringstream text;
    text << log.rdbuf();
    const std::string coordinator = text.str();
    for (const char* line : {": cluster 1 on aggregator", ": cluster 2 on aggregator"}) {
      EXPECT_TRUE(absl::StrContains(coordinator, line)) << line << "\n" << coordinator;
    }
    size_t backups = 0;
    for (size_t at = coordinator.find(" is backup 1 of the cluster of "); at != std::string::npos;
         at = coordinator.find(" is backup 1 of the cluster of ", at + 1)) {
      ++backups;
    }
    EXPECT_EQ(backups, 2u) << coordinator;
    EXPECT_TRUE(absl::StrContains(coordinator, " is backup 1 of the root ")) << coordinator;
  }
  for (const std::string& name : started) {
    EXPECT_TRUE(running[name]->Running()) << name << " died\n" << running[name]->LogTail(20);
    absl::Status h = host.WaitHealthy(name, absl::Seconds(20));
    EXPECT_TRUE(h.ok()) << h;
  }
  // The coordinator's state volume holds its database.
  EXPECT_FALSE(fs::is_empty(*dir + "/volumes/coordinator-state"));

  // Clean stop, peers first: each exits 0 on SIGTERM.
  std::vector<process::Process*> peers, aggregators, coordinators;
  for (const std::string& name : started) {
    process::Process* p = running[name].get();
    const std::string program = compose->Find(name)->Argv()[0];
    (program == "shoal-peer"         ? peers
     : program == "shoal-aggregator" ? aggregators
                                     : coordinators)
        .push_back(p);
  }
  process::StopInOrder({peers, aggregators, coordinators}, absl::Seconds(10));
  for (const std::string& name : started) {
    std::optional<process::ExitStatus> exit = running[name]->Poll();
    ASSERT_TRUE(exit.has_value()) << name;
    EXPECT_TRUE(exit->success()) << name << ": " << exit->ToString() << "\n"
                                 << running[name]->LogTail(10);
  }
  std::error_code ignored;
  if (!::testing::Test::HasFailure()) fs::remove_all(*dir, ignored);
}

TEST(ComposeClusterTest, ComposeCommandsTrainTheDefaultTask) { RunComposeCluster("", kTask, 7); }

// `SHOAL_TASK=fashion-mnist-replicated docker compose --profile hierarchical up`: four more
// aggregators, and the task runs on a root and two clusters, each with a backup.
TEST(ComposeClusterTest, TheHierarchicalProfileTrainsATreeWithReplicas) {
  ASSERT_EQ(setenv("SHOAL_TASK", "fashion-mnist-replicated", 1), 0);
  struct Unset {
    ~Unset() { unsetenv("SHOAL_TASK"); }
  } unset;
  RunComposeCluster("hierarchical", "fashion-mnist-replicated", 11);
}

}  // namespace
}  // namespace shoal::testing
