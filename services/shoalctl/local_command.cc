// `shoalctl local`: a whole cluster on 127.0.0.1 (local_cluster.h) training one task.

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"
#include "libs/training/model_names.h"  // the model constants only: no LibTorch
#include "services/shoalctl/dispatcher.h"
#include "services/shoalctl/local_cluster.h"
#include "services/shoalctl/process.h"
#include "services/shoalctl/task_format.h"
#include "services/shoalctl/watch.h"

namespace shoal::shoalctl::internal {
namespace {

using coordinator::v1::TaskStatus;

constexpr char kDefaultDataDir[] = "/usr/share/datasets/fashion-mnist";

}  // namespace

int Shoalctl::Local() {
  const std::string usage =
      "shoalctl local --peers N --task FILE [--aggregators N] [--data-dir DIR | --peer-data DIR] "
      "[--state-dir DIR] "
      "[--bin-dir DIR] [--startup-timeout 60s] [--keep-going] [--console HOST:PORT] [--insecure]";
  if (absl::Status s =
          CheckArgs(args_, 1, 0,
                    {"peers", "task", "aggregators", "data-dir", "peer-data", "state-dir",
                     "bin-dir", "startup-timeout", "keep-going", "console"},
                    usage);
      !s.ok()) {
    return UsageFail(s);
  }
  if (args_.values.count("peers") == 0 || args_.values.count("task") == 0) {
    return Fail(env_, absl::StrCat("--peers and --task are required; usage: ", usage), 2);
  }
  process::LocalClusterOptions options;
  absl::StatusOr<int> peers = ParseIntFlag("peers", args_.values["peers"], 1, 256);
  if (!peers.ok()) return UsageFail(peers.status());
  options.peers = *peers;
  if (args_.values.count("aggregators") > 0) {
    absl::StatusOr<int> aggregators =
        ParseIntFlag("aggregators", args_.values["aggregators"], 0, 16);
    if (!aggregators.ok()) return UsageFail(aggregators.status());
    options.aggregators = *aggregators;
  }
  if (args_.values.count("startup-timeout") > 0) {
    absl::StatusOr<absl::Duration> d =
        ParseDurationFlag("startup-timeout", args_.values["startup-timeout"]);
    if (!d.ok()) return UsageFail(d.status());
    options.startup_timeout = *d;
  }
  const bool keep_going = args_.switches.count("keep-going") > 0;
  if (args_.values.count("tls-dir") > 0) {
    return Fail(env_,
                "--tls-dir does not apply to local: it makes its own certificates "
                "(or pass --insecure for plaintext)",
                2);
  }
  options.insecure = g_.tls.insecure;
  if (args_.values.count("console") > 0) options.console_listen = args_.values["console"];

  // Check the task before starting anything.
  absl::StatusOr<common::v1::TaskSpec> spec = task::LoadTaskFile(args_.values["task"]);
  if (!spec.ok()) return Fail(env_, std::string(spec.status().message()));
  if (spec->join_token().empty()) spec->set_join_token(env_.default_join_token);
  if (!spec->join_token().empty()) {
    options.peer_args.push_back("--join-token");
    options.peer_args.push_back(spec->join_token());
  }
  // Decentralized and gossip tasks need no aggregator: start none unless asked for.
  const bool needs_aggregator = task::ModeDefinitionOrDefault(spec->mode()).uses_aggregator;
  if (args_.values.count("aggregators") == 0 && !needs_aggregator) options.aggregators = 0;
  if (options.aggregators == 0 && needs_aggregator) {
    return Fail(env_,
                absl::StrCat(args_.values["task"], ": a ", ModeName(spec->mode()),
                             " task needs --aggregators >= 1"),
                2);
  }
  if (spec->min_participants() > static_cast<uint32_t>(options.peers)) {
    return Fail(
        env_,
        absl::StrCat(args_.values["task"], ": min_participants is ", spec->min_participants(),
                     " but --peers is ", options.peers, "; the task would never start"),
        2);
  }

  if (args_.values.count("data-dir") > 0 && args_.values.count("peer-data") > 0) {
    return Fail(env_, "--data-dir and --peer-data exclude each other", 2);
  }
  options.data_dir =
      args_.values.count("data-dir") > 0 ? args_.values["data-dir"] : kDefaultDataDir;
  if (args_.values.count("peer-data") > 0) options.peer_data_dir = args_.values["peer-data"];
  // A TorchScript task's file is named relative to the task file; every peer reads it there.
  if (spec->model() == training::kTorchScriptModel) {
    std::error_code ec;
    const std::filesystem::path dir =
        std::filesystem::absolute(std::filesystem::path(args_.values["task"]).parent_path(), ec);
    options.peer_args.insert(options.peer_args.end(), {"--model-dir", dir.string()});
  }
  if (args_.values.count("bin-dir") > 0) {
    options.bin_dir = args_.values["bin-dir"];
  } else {
    absl::StatusOr<std::string> dir = process::SelfExecutableDir();
    if (!dir.ok()) return Fail(env_, std::string(dir.status().message()));
    options.bin_dir = *dir;
  }
  if (args_.values.count("state-dir") > 0) {
    options.state_dir = args_.values["state-dir"];
    if (mkdir(options.state_dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return Fail(env_, absl::StrCat("--state-dir: cannot create ", options.state_dir));
    }
  } else {
    absl::StatusOr<std::string> dir = process::MakeTempDir(env_.temp_dir, "shoal-local-");
    if (!dir.ok()) return Fail(env_, std::string(dir.status().message()));
    options.state_dir = *dir;
  }

  if (env_.interrupt != nullptr) env_.interrupt->graceful = true;
  std::ostream& out = *env_.out;
  out << "state dir " << options.state_dir << " (service logs in " << options.state_dir
      << "/logs/)\n";
  out << "starting 1 coordinator, " << options.aggregators << " aggregator(s), " << options.peers
      << " peer(s) from " << options.bin_dir << "\n"
      << std::flush;
  const std::atomic<bool>* abort =
      env_.interrupt != nullptr ? &env_.interrupt->interrupted : nullptr;
  absl::StatusOr<std::unique_ptr<process::LocalCluster>> cluster =
      process::LocalCluster::Start(options, &out, abort);
  if (!cluster.ok()) {
    if (abort != nullptr && abort->load())
      return Fail(env_, "interrupted; stopped the services", 130);
    return Fail(env_, std::string(cluster.status().message()));
  }
  const std::string coordinator = (*cluster)->coordinator_address();
  g_.coordinator = coordinator;
  if (!(*cluster)->ConsoleUrl().empty()) {
    out << "web console: " << (*cluster)->ConsoleUrl() << " (log in with the admin token in "
        << (*cluster)->ConsoleTokensPath() << "; it stops with the cluster)\n"
        << std::flush;
  }

  int code = 1;
  std::string failure;
  std::optional<TaskStatus> final_status;
  {
    rpc::TlsOptions client_tls;
    client_tls.dir = (*cluster)->ClientTlsDir();
    client_tls.insecure = client_tls.dir.empty();
    auto client = Client(coordinator, client_tls);
    if (!client.ok()) return Fail(env_, std::string(client.status().message()));
    absl::StatusOr<TaskStatus> created = (*client)->CreateTask(*spec, g_.timeout);
    if (!created.ok()) {
      failure = absl::StrCat("cannot create the task: ",
                             DescribeRpcError(created.status(), coordinator, "", g_.timeout));
    } else {
      out << "created task " << spec->name() << ": " << spec->model() << " on "
          << spec->dataset().name() << ", " << spec->rounds() << " rounds of "
          << spec->round_batches() << " batches; try `shoalctl --coordinator " << coordinator
          << (client_tls.insecure ? std::string(" --insecure")
                                  : absl::StrCat(" --tls-dir ", client_tls.dir))
          << " task status " << spec->name() << "`\n"
          << std::flush;
      ProgressPrinter printer(out, env_.out_is_tty, env_.tty_columns);
      Canceller& canceller = env_.interrupt->canceller;
      // Watches the children while the main thread watches the task.
      absl::Notification done;
      absl::Mutex failure_mu;
      std::thread supervisor([&] {
        std::vector<std::string> ignore;
        while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
          std::optional<std::string> exit = (*cluster)->FirstUnexpectedExit(ignore);
          if (!exit.has_value()) continue;
          const std::string who = exit->substr(0, exit->find(' '));
          process::Service* service = (*cluster)->Find(who);
          if (keep_going && service != nullptr && service->kind == "peer") {
            printer.Note(
                absl::StrCat("warning: ", *exit, "\n(--keep-going: continuing without it)"));
            ignore.push_back(who);
            continue;
          }
          {
            absl::MutexLock lock(&failure_mu);
            failure = *exit;
          }
          canceller.Cancel();
          return;
        }
      });
      absl::StatusOr<TaskStatus> result =
          WatchUntilEnd(**client, spec->name(), printer, env_, coordinator);
      done.Notify();
      supervisor.join();
      printer.Finish();
      absl::MutexLock lock(&failure_mu);
      if (failure.empty()) {
        if (result.ok()) {
          // The full history, including the final evaluation.
          absl::StatusOr<TaskStatus> latest = (*client)->GetTaskStatus(spec->name(), g_.timeout);
          final_status = latest.ok() && IsTerminal(latest->state()) ? *latest : *result;
        } else if (env_.interrupt->interrupted.load()) {
          failure = "interrupted";
          code = 130;
        } else {
          failure = DescribeRpcError(result.status(), coordinator, spec->name(), g_.timeout);
        }
      }
    }
  }
  if (final_status.has_value()) {
    out << "\n" << FormatSummary(*final_status);
    code = final_status->state() == coordinator::v1::TASK_STATE_COMPLETED ? 0 : 1;
  }
  if (!failure.empty()) *env_.err << "shoalctl: " << failure << "\n" << std::flush;
  out << "stopping the services...\n" << std::flush;
  (*cluster)->Stop(absl::Seconds(10));
  out << "stopped; logs are in " << options.state_dir << "/logs/\n" << std::flush;
  return code;
}

}  // namespace shoal::shoalctl::internal
