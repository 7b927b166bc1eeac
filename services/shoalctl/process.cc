#include "services/shoalctl/process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <deque>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/address_file.h"

extern char** environ;

namespace shoal::process {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

ExitStatus FromWaitStatus(int status) {
  ExitStatus out;
  if (WIFSIGNALED(status)) {
    out.signaled = true;
    out.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    out.code = WEXITSTATUS(status);
  }
  return out;
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Everything the child needs, prepared before fork() so the child only makes
// async-signal-safe calls.
struct ExecPlan {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

ExecPlan MakePlan(const ProcessOptions& options) {
  ExecPlan plan;
  plan.argv_storage.push_back(options.binary);
  for (const std::string& arg : options.args) plan.argv_storage.push_back(arg);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (options.env.count(key) == 0) plan.env_storage.push_back(entry);
  }
  for (const auto& [key, value] : options.env) plan.env_storage.push_back(key + "=" + value);
  for (std::string& s : plan.argv_storage) plan.argv.push_back(s.data());
  plan.argv.push_back(nullptr);
  for (std::string& s : plan.env_storage) plan.envp.push_back(s.data());
  plan.envp.push_back(nullptr);
  return plan;
}

[[noreturn]] void ChildFail(int report_fd, int err) {
  ssize_t ignored = write(report_fd, &err, sizeof(err));
  (void)ignored;
  _exit(127);
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signaled) {
    const char* name = strsignal(signal);
    return absl::StrCat("killed by signal ", signal,
                        name != nullptr ? absl::StrCat(" (", name, ")") : "");
  }
  return absl::StrCat("exit code ", code);
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(ProcessOptions options) {
  if (options.binary.empty()) return absl::InvalidArgumentError("no binary to run");
  if (options.name.empty()) options.name = options.binary;
  ExecPlan plan = MakePlan(options);

  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
      return ErrnoStatus(errno, absl::StrCat("cannot open log file ", options.log_path));
  }
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    if (log_fd >= 0) close(log_fd);
    return ErrnoStatus(err, "pipe2");
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(report[0]);
    close(report[1]);
    if (log_fd >= 0) close(log_fd);
    return ErrnoStatus(err, absl::StrCat("cannot start ", options.name));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (options.own_process_group) setpgid(0, 0);
    if (options.term_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) ChildFail(report[1], errno);
      // The parent may have died before prctl took effect.
      if (getppid() != parent) _exit(1);
    }
    // The parent blocks shutdown signals and ignores SIGPIPE; both would survive exec.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    }
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0 && null_fd != STDIN_FILENO) {
      dup2(null_fd, STDIN_FILENO);
      close(null_fd);
    }
    if (log_fd >= 0) {
      if (dup2(log_fd, STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0) {
        ChildFail(report[1], errno);
      }
    }
    execve(plan.argv[0], plan.argv.data(), plan.envp.data());
    ChildFail(report[1], errno);
  }

  // Parent.
  close(report[1]);
  if (log_fd >= 0) close(log_fd);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoStatus(child_errno, absl::StrCat("cannot run ", options.binary));
  }
  return std::unique_ptr<Process>(new Process(std::move(options), pid));
}

Process::~Process() {
  if (Running()) Stop(absl::Seconds(5));
}

std::optional<ExitStatus> Process::Poll() {
  absl::MutexLock lock(&mu_);
  if (exit_.has_value()) return exit_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_ = FromWaitStatus(status);
  } else if (r < 0 && errno == ECHILD) {
    // Reaped elsewhere (e.g. SIGCHLD ignored): it is gone, how is unknown.
    exit_ = ExitStatus{.signaled = false, .code = -1, .signal = 0};
  }
  return exit_;
}

absl::StatusOr<ExitStatus> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<ExitStatus> status = Poll()) return *status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          name(), " (pid ", pid_, ") still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(kPollInterval, deadline - absl::Now()));
  }
}

void Process::Signal(int sig) {
  // Under the lock, so the pid cannot be reaped (and reused) between the check and kill().
  absl::MutexLock lock(&mu_);
  if (exit_.has_value()) return;
  kill(pid_, sig);
  if (sig == SIGKILL && options_.own_process_group) kill(-pid_, SIGKILL);
}

ExitStatus Process::Stop(absl::Duration grace) {
  if (std::optional<ExitStatus> status = Poll()) return *status;
  Signal(SIGTERM);
  absl::StatusOr<ExitStatus> status = Wait(grace);
  if (status.ok()) return *status;
  Signal(SIGKILL);
  status = Wait(absl::Seconds(30));
  if (status.ok()) return *status;
  return ExitStatus{.signaled = true, .code = 0, .signal = SIGKILL};
}

std::string Process::LogTail(int max_lines) const {
  if (options_.log_path.empty()) return "";
  return TailFile(options_.log_path, max_lines);
}

absl::StatusOr<std::map<std::string, std::string>> WaitForAddressFile(
    const std::string& path, Process* process, absl::Duration timeout,
    const std::atomic<bool>* abort) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (access(path.c_str(), R_OK) == 0) {
      absl::StatusOr<std::map<std::string, std::string>> addresses = ReadAddressFile(path);
      if (addresses.ok() && addresses->count("grpc") > 0) return addresses;
    }
    if (process != nullptr) {
      if (std::optional<ExitStatus> exit = process->Poll()) {
        std::string message = absl::StrCat(process->name(), " exited (", exit->ToString(),
                                           ") before writing its address file ", path);
        const std::string tail = process->LogTail(20);
        if (!tail.empty()) {
          absl::StrAppend(&message, "; last lines of ", process->log_path(), ":\n", tail);
        }
        return absl::FailedPreconditionError(message);
      }
    }
    if (abort != nullptr && abort->load()) return absl::CancelledError("interrupted");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(process != nullptr ? process->name() : std::string("service"),
                       " wrote no address file ", path, " within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void StopInOrder(const std::vector<std::vector<Process*>>& groups, absl::Duration grace,
                 const std::function<void(Process&)>& before_kill) {
  for (const std::vector<Process*>& group : groups) {
    for (Process* p : group) {
      if (p != nullptr) p->Signal(SIGTERM);
    }
    const absl::Time deadline = absl::Now() + grace;
    for (Process* p : group) {
      if (p == nullptr) continue;
      if (!p->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration())).ok()) {
        if (before_kill) before_kill(*p);
        p->Signal(SIGKILL);
        (void)p->Wait(absl::Seconds(30));
      }
    }
  }
}

absl::StatusOr<std::string> SelfExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ErrnoStatus(errno, "readlink /proc/self/exe");
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return std::string(".");
  if (slash == 0) return std::string("/");
  return path.substr(0, slash);
}

std::string TailFile(const std::string& path, int max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in || max_lines <= 0) return "";
  // Only the end of a long log matters.
  constexpr std::streamoff kMaxBytes = 64 << 10;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > kMaxBytes ? size - kMaxBytes : 0;
  in.seekg(start);
  std::deque<std::string> lines;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first && start > 0) {  // a partial line
      first = false;
      continue;
    }
    first = false;
    lines.push_back(line);
    if (lines.size() > static_cast<size_t>(max_lines)) lines.pop_front();
  }
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<std::string> MakeTempDir(const std::string& parent, const std::string& prefix) {
  std::string pattern = absl::StrCat(parent.empty() ? "/tmp" : parent, "/", prefix, "XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return ErrnoStatus(errno, absl::StrCat("cannot create a directory like ", pattern));
  }
  return pattern;
}

}  // namespace shoal::process
