#pragma once

// Starting and supervising child processes: the local launcher (`shoalctl local`) and the
// cluster tests use this to run the Shoal services as real processes on 127.0.0.1.

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal::process {

// How a child ended.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled

  bool success() const { return !signaled && code == 0; }
  // "exit code 1", "killed by signal 9 (Killed)".
  std::string ToString() const;
};

struct ProcessOptions {
  std::string name;               // for messages, e.g. "peer-2"
  std::string binary;             // path of the executable (no PATH search)
  std::vector<std::string> args;  // without argv[0]
  // stdout and stderr go to this file (created, or appended to); empty = inherit the parent's.
  std::string log_path;
  // Extra environment variables on top of the parent's environment.
  std::map<std::string, std::string> env;
  // The child gets SIGTERM when the thread that started it dies (PR_SET_PDEATHSIG), so nothing
  // is orphaned even if the parent is SIGKILLed. Start children from a thread that lives as
  // long as they should (the main thread): the signal follows the starting thread, not the
  // process.
  bool term_with_parent = true;
  // Run the child in its own process group, so a terminal's Ctrl-C reaches only the parent,
  // which then stops the children in order.
  bool own_process_group = true;
};

// One child process. Owned by whoever started it; the destructor stops the child (SIGTERM,
// then SIGKILL after a grace period) if it is still running. Thread-safe.
class Process {
 public:
  // Forks and execs. Errors: INVALID_ARGUMENT empty binary; NOT_FOUND / PERMISSION_DENIED /
  // INTERNAL when exec fails (reported by the child through a pipe, so a missing binary is an
  // error here and not a mysterious exit code 127 later); the log file cannot be opened.
  static absl::StatusOr<std::unique_ptr<Process>> Start(ProcessOptions options);

  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return options_.name; }
  const std::string& log_path() const { return options_.log_path; }
  const ProcessOptions& options() const { return options_; }

  // The exit status if the child has ended (reaps it), without blocking.
  std::optional<ExitStatus> Poll();
  bool Running() { return !Poll().has_value(); }
  // Waits up to `timeout` for the child to end. DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<ExitStatus> Wait(absl::Duration timeout);
  // Sends `sig` (no-op once the child has been reaped).
  void Signal(int sig);
  // SIGTERM, wait up to `grace`, then SIGKILL and wait. Idempotent.
  ExitStatus Stop(absl::Duration grace = absl::Seconds(10));

  // The last `max_lines` lines of the log file ("" when there is none).
  std::string LogTail(int max_lines = 20) const;

 private:
  Process(ProcessOptions options, pid_t pid) : options_(std::move(options)), pid_(pid) {}

  const ProcessOptions options_;
  const pid_t pid_;
  absl::Mutex mu_;
  std::optional<ExitStatus> exit_ ABSL_GUARDED_BY(mu_);
};

// Waits until the service started as `process` has written its `--address-file` (see
// libs/common/address_file.h) and returns its `key=HOST:PORT` entries. Fails early, with the
// tail of the process's log, if the process exits first. Errors: DEADLINE_EXCEEDED after
// `timeout`; FAILED_PRECONDITION the process exited; CANCELLED `*abort` became true.
absl::StatusOr<std::map<std::string, std::string>> WaitForAddressFile(
    const std::string& path, Process* process, absl::Duration timeout,
    const std::atomic<bool>* abort = nullptr);

// Stops processes in order: each group gets SIGTERM together, then up to `grace` to exit, then
// SIGKILL; then the next group. Use {peers, aggregators, {coordinator}} for a clean leave.
// `before_kill`, when set, is called with each process still running at its deadline, just
// before its SIGKILL (tests dump its threads' stacks there).
void StopInOrder(const std::vector<std::vector<Process*>>& groups, absl::Duration grace,
                 const std::function<void(Process&)>& before_kill = nullptr);

// The directory of the running executable (from /proc/self/exe).
absl::StatusOr<std::string> SelfExecutableDir();

// The last `max_lines` lines of a text file ("" when it cannot be read).
std::string TailFile(const std::string& path, int max_lines);

// Creates a fresh directory `<parent>/<prefix>XXXXXX` (parent "" = /tmp) and returns its path.
absl::StatusOr<std::string> MakeTempDir(const std::string& parent, const std::string& prefix);

}  // namespace shoal::process
