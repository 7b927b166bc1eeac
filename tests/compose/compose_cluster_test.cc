// Runs docker-compose.yml's services as plain processes on 127.0.0.1, with the exact commands,
// health checks, volumes and start order of the compose file, so its wiring (ports, flags,
// certificates, volumes, dependencies) is exercised without a Docker engine:
//   - every compose service name resolves to 127.0.0.1 and every container port of a service
//     gets its own free host port (HOST:PORT in arguments, lists and URLs is rewritten
//     consistently);
//   - named volumes become temp directories, ./ bind mounts the source tree, the image's
//     `COPY deploy/tasks/ /etc/shoal/tasks/` a temp copy of the tasks cut down to stay fast;
//   - programs come from SHOAL_BIN_DIR (the image copies build/bin to /usr/local/bin); those of
//     an image built from another Dockerfile of the repository (deploy/etcd/Dockerfile:
//     Debian's etcd-server) from PATH;
//   - services start in file order once their depends_on conditions hold (completed
//     successfully / healthy by their own health check), other images are skipped.
// Then the compose `shoalctl` entrypoint watches the default task to completion.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
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
#include "libs/common/address.h"
#include "services/shoalctl/process.h"
#include "tests/compose/compose_file.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kTask[] = "fashion-mnist-cnn";
constexpr int kReducedRounds = 2;  // of every task the test runs

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

// The first `program` on PATH, or `program` itself.
std::string OnPath(const std::string& program) {
  for (absl::string_view dir : absl::StrSplit(Env("PATH", ""), ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return program;
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
    // HOST:PORT on its own, in a list or in a URL (http://etcd-0:2380, etcd://A:1,B:2/prefix).
    static const std::regex host_port(R"((^|[/,=])([A-Za-z0-9.-]+):([0-9]+)(?=$|[/,]))");
    std::string rewritten;
    size_t at = 0;
    for (std::sregex_iterator it(arg.begin(), arg.end(), host_port), end; it != end; ++it) {
      const std::smatch& m = *it;
      const std::string host = m[2];
      std::string owner;
      if (host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost") {
        owner = service;  // its own port
      } else if (names_.count(host) > 0) {
        owner = host;
      } else {
        continue;
      }
      absl::StatusOr<int> mapped = Port(owner, std::stoi(m[3]));
      if (!mapped.ok()) return mapped.status();
      const size_t host_at = static_cast<size_t>(m.position(2));
      absl::StrAppend(&rewritten, arg.substr(at, host_at - at), "127.0.0.1:", *mapped);
      at = static_cast<size_t>(m.position() + m.length());
    }
    if (at > 0) return rewritten + arg.substr(at);
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
    const ComposeService* s = compose_.Find(service);
    process::ProcessOptions options;
    options.name = name;
    options.binary = s->RunsShoalImage() ? Env("SHOAL_BIN_DIR", "build/bin") + "/" + (*rewritten)[0]
                                         : OnPath((*rewritten)[0]);
    options.args.assign(rewritten->begin() + 1, rewritten->end());
    options.log_path = absl::StrCat(dir_, "/logs/", name, ".log");
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

  // Asks each of `coordinators` for `task`'s status through `tool` (its entrypoint, given that
  // coordinator's address alone) until one answers: coordinators that share their tasks refuse
  // calls about a task another one owns. Returns the owner's name.
  absl::StatusOr<std::string> WaitForOwner(const std::vector<std::string>& coordinators,
                                           const std::string& tool, const std::string& task,
                                           absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status last;
    while (absl::Now() < deadline) {
      for (const std::string& coordinator : coordinators) {
        std::vector<std::string> argv = compose_.Find(tool)->entrypoint;
        auto flag = std::find(argv.begin(), argv.end(), "--coordinator");
        if (flag == argv.end() || flag + 1 == argv.end()) {
          return absl::FailedPreconditionError(tool + " has no --coordinator");
        }
        const ComposeService* s = compose_.Find(coordinator);
        absl::StatusOr<HostPort> listen = ParseHostPort(s->Flag("listen"), "--listen");
        if (!listen.ok()) return listen.status();
        *(flag + 1) = absl::StrCat(coordinator, ":", listen->port);
        argv.insert(argv.end(), {"task", "status", task});
        last = RunOnce(tool, absl::StrCat(tool, "-status"), argv, absl::Seconds(10));
        if (last.ok()) return coordinator;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("none of ", absl::StrJoin(coordinators, ", "), " serves ", task, " after ",
                     absl::FormatDuration(timeout), ": ", last.message()));
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
void WriteReducedTasks(const std::string& from, const std::string& to, int rounds) {
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    YAML::Node task = YAML::LoadFile(entry.path().string());
    task["rounds"] = rounds;
    task["round_batches"] = 25;
    task["dataset"]["train_limit"] = 4000;
    task["dataset"]["test_limit"] = 1000;
    std::ofstream out(to + "/" + entry.path().filename().string());
    out << YAML::Dump(task) << "\n";
  }
}

// A coordinator on etcd: one of several that share the tasks on one prefix.
bool IsEtcdCoordinator(const ComposeService& s) {
  return !s.Argv().empty() && s.Argv()[0] == "shoal-coordinator" &&
         absl::StartsWith(s.Flag("store"), "etcd://");
}

struct ClusterRun {
  std::string profile;  // its services start too; "" = the default ones only
  std::string task;
  size_t daemons = 0;             // long-running services that start
  std::string tool = "shoalctl";  // the compose service whose entrypoint watches the task
  bool kill_owner = false;        // SIGKILL the coordinator that owns the task while it trains
  std::string up;                 // `compose up SERVICE`: it and what it depends on; "" = all
  int rounds = kReducedRounds;    // of the task
};

// `service` and every service it depends on, transitively.
std::set<std::string> WithDependencies(const ComposeFile& compose, const std::string& service) {
  std::set<std::string> out;
  std::vector<std::string> todo = {service};
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    const ComposeService* s = compose.Find(name);
    if (s == nullptr || !out.insert(name).second) continue;
    for (const auto& [dep, condition] : s->depends_on) todo.push_back(dep);
  }
  return out;
}

// Runs the compose file's services (those of `run.profile` too) as plain processes and watches
// the task to completion.
void RunComposeCluster(const ClusterRun& run) {
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
      WriteReducedTasks(source_dir + "/deploy/tasks", *dir + "/image/tasks", run.rounds);
      host.AddImagePath(target, *dir + "/image/tasks");
    } else {
      host.AddImagePath(target, source_dir + "/" + words[0]);
    }
  }

  // Start in file order, honouring depends_on like compose does.
  std::map<std::string, std::unique_ptr<process::Process>> running;
  std::vector<std::string> started;  // long-running, in start order
  std::set<std::string> completed, healthy;
  const std::set<std::string> wanted =
      run.up.empty() ? std::set<std::string>() : WithDependencies(*compose, run.up);
  const absl::Time begin = absl::Now();
  for (const ComposeService& s : compose->services) {
    if (!run.up.empty() && wanted.count(s.name) == 0) continue;
    if (!s.RunsShoalImage() && s.dockerfile.empty()) {
      std::cerr << "skipping " << s.name << " (image " << s.image << ", not built here)\n";
      continue;
    }
    // A profile's services start only on request (the shoalctl tool, `--profile hierarchical`).
    if (!s.profiles.empty() &&
        std::find(s.profiles.begin(), s.profiles.end(), run.profile) == s.profiles.end()) {
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
      } else {
        ASSERT_TRUE(running.count(dep) == 1 || completed.count(dep) == 1)
            << s.name << " needs " << dep << ", not started";
      }
    }
    // One-shot jobs: certs, task creation; compose runs an on-failure one again until it
    // succeeds (the `ha` task, until a coordinator answers).
    if (s.restart == "no" || s.restart == "on-failure") {
      absl::Status done = host.RunOnce(s.name, s.name, s.Argv(), absl::Seconds(60));
      const absl::Time retry_until = absl::Now() + absl::Seconds(60);
      for (int again = 1; !done.ok() && s.restart == "on-failure" && absl::Now() < retry_until;
           ++again) {
        absl::SleepFor(absl::Milliseconds(500));
        done = host.RunOnce(s.name, absl::StrCat(s.name, "-", again), s.Argv(), absl::Seconds(60));
      }
      ASSERT_TRUE(done.ok()) << done;
      completed.insert(s.name);
      continue;
    }
    auto proc = host.Start(s.name, s.name, s.Argv());
    ASSERT_TRUE(proc.ok()) << s.name << ": " << proc.status();
    running[s.name] = *std::move(proc);
    started.push_back(s.name);
  }
  ASSERT_EQ(started.size(), run.daemons) << absl::StrJoin(started, ", ");
  ASSERT_EQ(completed.count("certs"), 1u);
  // Every service with a health check is healthy (every coordinator on etcd too: they share
  // the tasks, none waits as a standby). etcd has none: the coordinators wait for it.
  std::vector<std::string> on_etcd;
  for (const std::string& name : started) {
    if (IsEtcdCoordinator(*compose->Find(name))) on_etcd.push_back(name);
  }
  std::string killed;
  auto wait_healthy = [&](absl::Duration timeout) {
    for (const std::string& name : started) {
      const ComposeService* s = compose->Find(name);
      if (s->healthcheck.empty() || name == killed) continue;
      absl::Status h = host.WaitHealthy(name, timeout);
      EXPECT_TRUE(h.ok()) << h << "\n" << running[name]->LogTail(20);
    }
  };
  wait_healthy(absl::Seconds(60));
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::cerr << "all " << started.size() << " services healthy after "
            << absl::FormatDuration(absl::Now() - begin) << "\n";

  // The compose tool watches the task until it ends; exit 0 = completed.
  const ComposeService* tool = compose->Find(run.tool);
  ASSERT_NE(tool, nullptr);
  std::vector<std::string> watch = tool->entrypoint;
  watch.insert(watch.end(), {"task", "watch", run.task});
  absl::Status watched;
  if (!run.kill_owner) {
    watched = host.RunOnce(run.tool, "shoalctl-watch", watch, absl::Seconds(150));
  } else {
    ASSERT_GT(on_etcd.size(), 1u) << "no coordinator to take the task over";
    auto watcher = host.Start(run.tool, "shoalctl-watch", watch);
    ASSERT_TRUE(watcher.ok()) << watcher.status();
    // The task is under way: the watch prints "K/ROUNDS" for a closed round K before the last.
    // (The profile's task service created it before the watch started, so on a fast machine the
    // first rounds may be over already; the task has rounds enough to be killed in the middle.)
    auto under_way = [&] {
      const std::string tail = (*watcher)->LogTail(5);
      if (absl::StrContains(tail, "completed")) return false;
      for (int k = 1; k < run.rounds; ++k) {
        if (absl::StrContains(tail, absl::StrCat(" ", k, "/", run.rounds, " "))) return true;
      }
      return false;
    };
    const absl::Time round_deadline = absl::Now() + absl::Seconds(120);
    while (!under_way() && (*watcher)->Running() && absl::Now() < round_deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(under_way()) << "the kill must come while the task trains\n"
                             << (*watcher)->LogTail(20);
    absl::StatusOr<std::string> owner =
        host.WaitForOwner(on_etcd, run.tool, run.task, absl::Seconds(20));
    ASSERT_TRUE(owner.ok()) << owner.status();
    const absl::Time kill = absl::Now();
    running[*owner]->Signal(SIGKILL);
    ASSERT_TRUE(running[*owner]->Wait(absl::Seconds(10)).ok());
    killed = *owner;
    on_etcd.erase(std::find(on_etcd.begin(), on_etcd.end(), killed));
    absl::StatusOr<std::string> next =
        host.WaitForOwner(on_etcd, run.tool, run.task, absl::Seconds(30));
    ASSERT_TRUE(next.ok()) << next.status();
    std::cerr << killed << " (the task's owner) killed while the task trained; " << *next
              << " serves it " << absl::FormatDuration(absl::Now() - kill) << " later\n";
    absl::StatusOr<process::ExitStatus> exit = (*watcher)->Wait(absl::Seconds(150));
    watched = !exit.ok() ? exit.status()
              : exit->success()
                  ? absl::OkStatus()
                  : absl::InternalError(absl::StrCat("the watch ended with ", exit->ToString()));
    std::cerr << "task ended " << absl::FormatDuration(absl::Now() - kill) << " after the kill\n";
  }
  std::string tails;
  for (const std::string& name : started) {
    absl::StrAppend(&tails, "--- ", name, "\n", running[name]->LogTail(8));
  }
  ASSERT_TRUE(watched.ok()) << watched << "\n" << tails;
  std::ifstream watch_log(*dir + "/logs/shoalctl-watch.log");
  std::stringstream watch_text;
  watch_text << watch_log.rdbuf();
  EXPECT_TRUE(absl::StrContains(watch_text.str(),
                                absl::StrCat("completed after ", run.rounds, "/", run.rounds)))
      << watch_text.str();
  std::cerr << watch_text.str();
  std::cerr << "task completed after " << absl::FormatDuration(absl::Now() - begin) << "\n";

  // Its default command (`task list`) works too, and every service is still healthy.
  EXPECT_TRUE(host.RunOnce(run.tool, "shoalctl-list", tool->Argv(), absl::Seconds(20)).ok());
  if (run.profile == "hierarchical") {
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
    if (name == killed) continue;
    EXPECT_TRUE(running[name]->Running()) << name << " died\n" << running[name]->LogTail(20);
  }
  wait_healthy(absl::Seconds(20));
  // The coordinators' state volume holds their checkpoints (and the SQLite database).
  for (const std::string& name : started) {
    const ComposeService* s = compose->Find(name);
    if (s->Argv()[0] != "shoal-coordinator") continue;
    absl::StatusOr<std::string> state = host.Rewrite(name, s->Flag("state-dir"));
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_FALSE(fs::is_empty(*state)) << name << ": " << *state;
  }

  // Clean stop, peers first: each Shoal service exits 0 on SIGTERM. Then etcd, killed: its
  // graceful stop of three members at once takes seconds, and its data is the test's.
  std::vector<process::Process*> peers, aggregators, coordinators, others;
  for (const std::string& name : started) {
    if (name == killed) continue;
    process::Process* p = running[name].get();
    const std::string program = compose->Find(name)->Argv()[0];
    (program == "shoal-peer"          ? peers
     : program == "shoal-aggregator"  ? aggregators
     : program == "shoal-coordinator" ? coordinators
                                      : others)
        .push_back(p);
  }
  process::StopInOrder({peers, aggregators, coordinators}, absl::Seconds(10));
  for (process::Process* p : others) p->Stop(absl::ZeroDuration());
  for (const std::string& name : started) {
    if (name == killed || !compose->Find(name)->RunsShoalImage()) continue;
    std::optional<process::ExitStatus> exit = running[name]->Poll();
    ASSERT_TRUE(exit.has_value()) << name;
    EXPECT_TRUE(exit->success()) << name << ": " << exit->ToString() << "\n"
                                 << running[name]->LogTail(10);
  }
  std::error_code ignored;
  if (!::testing::Test::HasFailure()) fs::remove_all(*dir, ignored);
}

TEST(ComposeClusterTest, ComposeCommandsTrainTheDefaultTask) {
  RunComposeCluster({"", kTask, 7, "shoalctl", false, ""});
}

// `SHOAL_TASK=fashion-mnist-replicated docker compose --profile hierarchical up`: four more
// aggregators, and the task runs on a root and two clusters, each with a backup.
TEST(ComposeClusterTest, TheHierarchicalProfileTrainsATreeWithReplicas) {
  ASSERT_EQ(setenv("SHOAL_TASK", "fashion-mnist-replicated", 1), 0);
  struct Unset {
    ~Unset() { unsetenv("SHOAL_TASK"); }
  } unset;
  RunComposeCluster({"hierarchical", "fashion-mnist-replicated", 11, "shoalctl", false, ""});
}

// `docker compose --profile ha up ha-task`: three etcd members, three coordinators that share
// the tasks, the profile's own aggregators and peers. The coordinator that owns the task is
// SIGKILLed while it trains (after a round, before the last); another one takes it over and the
// task completes all its rounds, watched through the `ha-shoalctl` tool. Twelve rounds (about a
// second each on a quiet machine) leave the kill time to land before the end.
TEST(ComposeClusterTest, TheHaProfileSurvivesTheDeathOfTheTasksCoordinator) {
  RunComposeCluster(
      {"ha", kTask, 12, "ha-shoalctl", /*kill_owner=*/true, "ha-task", /*rounds=*/12});
}

}  // namespace
}  // namespace shoal::testing
