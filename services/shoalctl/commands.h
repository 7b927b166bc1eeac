#pragma once

// The shoalctl command line: parsing and the commands. main.cc only sets up signals.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/shoalctl/control_client.h"

namespace shoal::shoalctl {

// A parsed command line: positional words and --flags (either `--flag VALUE` or `--flag=VALUE`;
// switches take no value). `--` ends flag parsing.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;
  std::set<std::string> switches;
};
// Errors: INVALID_ARGUMENT unknown flag, missing value.
absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv);

// Ctrl-C / SIGTERM, delivered by main's signal thread. Thread-safe.
struct Interrupt {
  Canceller canceller;  // cancels the running watch / download
  std::atomic<bool> interrupted{false};
  // Set by long-running commands (watch, download, local) that stop cleanly on the first
  // signal; otherwise the signal ends the process at once.
  std::atomic<bool> graceful{false};
};

// Where the commands get their client from (a fake in tests).
using ClientFactory =
    std::function<absl::StatusOr<std::unique_ptr<ControlClientInterface>>(const std::string&)>;

struct Environment {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  int out_fd = 1;                  // binary output (`model get --out -`); stdout
  bool out_is_tty = false;         // live progress line with \r instead of one line per change
  int tty_columns = 0;             // terminal width (0 = unknown); the live line is cut to fit
  Interrupt* interrupt = nullptr;  // may be null
  ClientFactory make_client;       // null = a real ControlClient
  std::string default_coordinator = "127.0.0.1:7000";
  std::string default_tls_dir;     // $SHOAL_TLS_DIR
  std::string default_join_token;  // $SHOAL_JOIN_TOKEN: used when a task file has none
  std::string temp_dir;            // parent of `local`'s fresh state dir ("" = /tmp)
};

// Runs `shoalctl <argv...>` (argv without the program name). Returns the exit code: 0 success,
// 1 failure (one line "shoalctl: <what>" on err), 2 usage error, 130 interrupted.
int RunShoalctl(const std::vector<std::string>& argv, Environment& env);

// The usage text of `shoalctl help`.
std::string UsageText();

// One line for an RPC error: NOT_FOUND -> "no task named X", UNAVAILABLE -> "cannot reach
// coordinator at ADDR", DEADLINE_EXCEEDED -> "coordinator at ADDR did not answer within T".
std::string DescribeRpcError(const absl::Status& status, const std::string& coordinator,
                             const std::string& task_name, absl::Duration timeout);

}  // namespace shoal::shoalctl
