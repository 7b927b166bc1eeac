#pragma once

// Internal to shoalctl_lib: the dispatcher that runs one parsed command line, and what its
// command files share. commands.cc has the dispatch, the helpers and the small commands,
// task_commands.cc the `task` commands, model_commands.cc `model get`, local_command.cc `local`.

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/rpc/tls.h"
#include "services/shoalctl/commands.h"
#include "services/shoalctl/control_client.h"

namespace shoal::shoalctl::internal {

// The flags every command takes.
struct Globals {
  std::string coordinator;
  rpc::TlsOptions tls;  // --tls-dir (default $SHOAL_TLS_DIR) or --insecure
  absl::Duration timeout = absl::Seconds(10);
  bool timeout_given = false;
};

// Prints "shoalctl: <what>" on env.err and returns `code`: commands return their exit code.
int Fail(Environment& env, const std::string& what, int code = 1);

// Errors: INVALID_ARGUMENT naming the flag.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& name, const std::string& text);
absl::StatusOr<int> ParseIntFlag(const std::string& name, const std::string& text, int min,
                                 int max);

// Checks that `args` uses only `allowed` flags (plus the global ones) and exactly `positional`
// positional words after the command words. Errors: INVALID_ARGUMENT with the usage line.
absl::Status CheckArgs(const Args& args, size_t command_words, size_t positional,
                       const std::set<std::string>& allowed, const std::string& usage);

// Runs one parsed command line: Run() picks the command. Created by RunShoalctl for one run and
// used on its thread only (not thread-safe); `env` must outlive it.
class Shoalctl {
 public:
  Shoalctl(Environment& env, Args args, Globals globals)
      : env_(env), args_(std::move(args)), g_(std::move(globals)) {}

  // Returns the exit code (see RunShoalctl).
  int Run();

 private:
  // commands.cc
  absl::StatusOr<std::unique_ptr<ControlClientInterface>> Client(const std::string& address);
  absl::StatusOr<std::unique_ptr<ControlClientInterface>> Client(const std::string& address,
                                                                 const rpc::TlsOptions& tls);
  int RpcFail(const absl::Status& status, const std::string& task_name);
  int UsageFail(const absl::Status& status);  // usage errors exit 2
  int Health();
  int Peers();
  // model_commands.cc
  int ModelGet();

  // task_commands.cc
  int TaskCreate();
  int TaskList();
  int TaskStatusCmd();
  int TaskHistory();
  int TaskStop();
  int TaskDelete();
  int TaskWatch();

  // local_command.cc
  int Local();

  Environment& env_;
  Args args_;
  Globals g_;
};

}  // namespace shoal::shoalctl::internal
