#include "services/peer_agent/supernode_host.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"

namespace shoal::peer {
namespace {

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return absl::StrCat("ended (wait status ", status, ")");
}

// For the supervisor's wait: whether stop_ changed since it looked.
struct StopSeen {
  const bool* stop;
  bool seen;
  static bool Changed(StopSeen* s) { return *s->stop != s->seen; }
};

}  // namespace

absl::Status SupernodeHostOptions::Validate() const {
  SHOAL_RETURN_IF_ERROR(ParseHostPort(listen, "--supernode-listen").status());
  if (!advertise.empty()) {
    SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(advertise, "--supernode-advertise"));
    if (hp.port == 0) {
      return absl::InvalidArgumentError("--supernode-advertise: port must not be 0");
    }
  }
  std::error_code ec;
  if (binary.empty() || !std::filesystem::is_regular_file(binary, ec) ||
      access(binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--supernode-binary: \"", binary, "\" is not an executable file (shoal-aggregator)"));
  }
  return absl::OkStatus();
}

std::string DefaultAggregatorBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "shoal-aggregator";
  return (self.parent_path() / "shoal-aggregator").string();
}

SupernodeHost::SupernodeHost(SupernodeHostOptions options, prometheus::Gauge* running)
    : options_(std::move(options)), running_gauge_(running) {}

SupernodeHost::~SupernodeHost() {
  Stop("the peer stops");
  Wait();
}

std::vector<std::string> SupernodeHost::CommandLine(const std::string& peer_id) const {
  std::vector<std::string> args = {
      options_.binary,
      absl::StrCat("--coordinator=", options_.coordinator),
      absl::StrCat("--listen=", options_.listen),
      absl::StrCat("--metrics-listen=", options_.metrics_listen),
      absl::StrCat("--host-peer=", peer_id),
      absl::StrCat("--upload-probe-bytes=", options_.upload_probe_bytes)};
  if (!options_.advertise.empty()) args.push_back(absl::StrCat("--advertise=", options_.advertise));
  if (options_.tls.insecure) {
    args.push_back("--insecure");
  } else {
    args.push_back(absl::StrCat("--tls-dir=", options_.tls.dir));
  }
  return args;
}

void SupernodeHost::Start(const std::string& peer_id) {
  absl::MutexLock start(&start_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (running_) {
      LogInfo("elected supernode again: its aggregator runs already");
      return;
    }
    running_ = true;
    stop_ = false;
    kill_at_ = absl::InfiniteFuture();
  }
  if (supervisor_.joinable()) supervisor_.join();  // the previous child was reaped
  std::vector<std::string> args = CommandLine(peer_id);
  LogInfo("elected supernode: starting ", absl::StrJoin(args, " "));
  supervisor_ =
      std::thread([this, args = std::move(args)]() mutable { Supervise(std::move(args)); });
}

void SupernodeHost::Supervise(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  // The child is forked by this thread, which lives until it is reaped: PR_SET_PDEATHSIG
  // fires when the forking thread ends, so only the peer's death (or Stop) ends it.
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The shutdown signals stay blocked (inherited
    // mask): shoal-aggregator waits for them with sigwait.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the peer died before prctl
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid < 0) {
    LogError("elected supernode: cannot start ", args[0], ": fork failed (errno ", errno, ")");
    absl::MutexLock lock(&mu_);
    running_ = false;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    pid_ = pid;
    if (stop_) kill(pid, SIGTERM);  // Stop() came before the fork
  }
  if (running_gauge_ != nullptr) running_gauge_->Set(1);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    absl::MutexLock lock(&mu_);
    if (stop_ && absl::Now() >= kill_at_) {
      LogWarning("elected supernode: its aggregator (pid ", pid, ") ignored SIGTERM for ",
                 absl::FormatDuration(options_.stop_grace), ": killing it");
      kill(pid, SIGKILL);
      kill_at_ = absl::InfiniteFuture();
    }
    // Polls the child (no signal handler in this process); a Stop() wakes it at once.
    StopSeen seen{&stop_, stop_};
    mu_.AwaitWithTimeout(absl::Condition(&StopSeen::Changed, &seen), absl::Milliseconds(100));
  }
  if (running_gauge_ != nullptr) running_gauge_->Set(0);
  absl::MutexLock lock(&mu_);
  if (stop_) {
    LogInfo("elected supernode: its aggregator (pid ", pid, ") ", DescribeExit(status));
  } else {
    LogWarning("elected supernode: its aggregator (pid ", pid, ") ", DescribeExit(status),
               " unasked; the coordinator finds it lost");
  }
  pid_ = 0;
  running_ = false;
}

void SupernodeHost::Stop(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!running_ || stop_) return;
  stop_ = true;
  kill_at_ = absl::Now() + options_.stop_grace;
  LogInfo("stopping the supernode's aggregator: ", why);
  if (pid_ > 0) kill(pid_, SIGTERM);
}

void SupernodeHost::Wait() {
  absl::MutexLock start(&start_mu_);
  if (supervisor_.joinable()) supervisor_.join();
}

bool SupernodeHost::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace shoal::peer
