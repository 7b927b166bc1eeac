#include "services/shoalctl/commands.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/common/address.h"
#include "libs/common/backoff.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/tls.h"
#include "libs/task/task_file.h"
#include "libs/tensor/model_file.h"
#include "services/shoalctl/local_cluster.h"
#include "services/shoalctl/process.h"
#include "services/shoalctl/task_format.h"

namespace shoal::shoalctl {
namespace {

using coordinator::v1::TaskStatus;

constexpr char kDefaultDataDir[] = "/usr/share/datasets/fashion-mnist";
// A watch is a long call; it still gets a deadline, far beyond any sensible task.
constexpr absl::Duration kWatchDeadline = absl::Hours(24 * 7);
// How long `task watch` keeps reconnecting after losing the coordinator.
constexpr absl::Duration kReconnectBudget = absl::Seconds(60);

const std::set<std::string>& ValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "coordinator", "timeout",   "out",     "version",         "peers",   "task",   "aggregators",
      "data-dir",    "state-dir", "bin-dir", "startup-timeout", "tls-dir", "target", "service"};
  return *flags;
}

const std::set<std::string>& SwitchFlags() {
  static const auto* flags = new std::set<std::string>{"json", "keep-going", "help", "insecure"};
  return *flags;
}

// Thrown-free error plumbing: a command returns its exit code; errors print one line.
int Fail(Environment& env, const std::string& what, int code = 1) {
  *env.err << "shoalctl: " << what << "\n";
  env.err->flush();
  return code;
}

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& name, const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration()) return d;
  if (absl::SimpleAtod(text, &seconds) && seconds > 0) return absl::Seconds(seconds);
  return absl::InvalidArgumentError(absl::StrCat(
      "--", name, ": expected a positive duration like 10s or 2m, got \"", text, "\""));
}

absl::StatusOr<int> ParseIntFlag(const std::string& name, const std::string& text, int min,
                                 int max) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected an integer in ", min,
                                                   "..", max, ", got \"", text, "\""));
  }
  return value;
}

// Checks that `args` uses only `allowed` flags (plus the global ones) and exactly `positional`
// positional words after the command words.
absl::Status CheckArgs(const Args& args, size_t command_words, size_t positional,
                       const std::set<std::string>& allowed, const std::string& usage) {
  for (const auto& [flag, value] : args.values) {
    if (flag != "coordinator" && flag != "timeout" && flag != "tls-dir" &&
        allowed.count(flag) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " does not apply here; usage: ", usage));
    }
  }
  for (const std::string& flag : args.switches) {
    if (flag != "help" && flag != "insecure" && allowed.count(flag) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " does not apply here; usage: ", usage));
    }
  }
  if (args.positional.size() != command_words + positional) {
    return absl::InvalidArgumentError(absl::StrCat("usage: ", usage));
  }
  return absl::OkStatus();
}

// Prints the live progress line: rewritten in place on a terminal; otherwise (logs, CI) a line
// only when the settled round, the state or the peers change (FormatProgressLogLine). Thread-safe
// (the launcher's supervisor prints notes while the main thread updates).
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, bool tty, int columns)
      : out_(out), tty_(tty), columns_(columns) {}

  void Update(const TaskStatus& status) {
    std::string line = tty_ ? FormatProgressLine(status) : FormatProgressLogLine(status);
    // A wrapped line cannot be rewritten with \r.
    if (tty_ && columns_ > 1 && line.size() >= static_cast<size_t>(columns_)) {
      line.resize(static_cast<size_t>(columns_ - 1));
    }
    absl::MutexLock lock(&mu_);
    if (tty_) {
      out_ << "\r" << line << "\x1b[K" << std::flush;
    } else if (line != last_) {
      out_ << line << "\n" << std::flush;
    }
    last_ = line;
  }

  // A line of its own above the progress line.
  void Note(const std::string& text) {
    absl::MutexLock lock(&mu_);
    if (tty_ && !last_.empty()) {
      out_ << "\r\x1b[K" << text << "\n" << last_ << std::flush;
    } else {
      out_ << text << "\n" << std::flush;
    }
  }

  // Ends the live line.
  void Finish() {
    absl::MutexLock lock(&mu_);
    if (tty_ && !last_.empty()) out_ << "\n" << std::flush;
    last_.clear();
  }

 private:
  std::ostream& out_;
  const bool tty_;
  const int columns_;
  absl::Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
};

// Sleeps up to `d`, returning early when interrupted.
void InterruptibleSleep(absl::Duration d, const Interrupt* interrupt) {
  const absl::Time end = absl::Now() + d;
  while (absl::Now() < end) {
    if (interrupt != nullptr && interrupt->interrupted.load()) return;
    absl::SleepFor(std::min(absl::Milliseconds(50), end - absl::Now()));
  }
}

// Watches a task until it ends, reconnecting for a while when the stream breaks.
absl::StatusOr<TaskStatus> WatchUntilEnd(ControlClientInterface& client, const std::string& name,
                                         ProgressPrinter& printer, Environment& env,
                                         const std::string& coordinator) {
  Canceller local_canceller;
  Canceller* canceller = env.interrupt != nullptr ? &env.interrupt->canceller : &local_canceller;
  Backoff backoff(BackoffOptions{.initial = absl::Milliseconds(200), .max = absl::Seconds(5)});
  std::optional<TaskStatus> last;
  std::optional<absl::Time> retry_until;
  while (true) {
    absl::StatusOr<TaskStatus> result = client.WatchTask(
        name, kWatchDeadline,
        [&](const TaskStatus& status) {
          last = status;
          retry_until.reset();
          backoff.Reset();
          printer.Update(status);
          return !IsTerminal(status.state());
        },
        canceller);
    if (result.ok() && IsTerminal(result->state())) return result;
    if (!result.ok()) {
      const absl::StatusCode code = result.status().code();
      if (code == absl::StatusCode::kCancelled || code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kInvalidArgument || !last.has_value()) {
        return result.status();
      }
    }
    // The stream ended or broke while the task still runs: reconnect.
    const absl::Time now = absl::Now();
    if (!retry_until.has_value()) {
      retry_until = now + kReconnectBudget;
      printer.Note(absl::StrCat("lost the watch stream (",
                                result.ok() ? "ended early" : result.status().ToString(),
                                "); reconnecting to ", coordinator));
    } else if (now >= *retry_until) {
      return result.ok() ? absl::UnavailableError("the watch stream keeps ending")
                         : result.status();
    }
    InterruptibleSleep(backoff.Next(), env.interrupt);
    if (canceller->cancelled()) return absl::CancelledError("cancelled");
  }
}

struct Globals {
  std::string coordinator;
  rpc::TlsOptions tls;  // --tls-dir (default $SHOAL_TLS_DIR) or --insecure
  absl::Duration timeout = absl::Seconds(10);
  bool timeout_given = false;
};

class Shoalctl {
 public:
  Shoalctl(Environment& env, Args args, Globals globals)
      : env_(env), args_(std::move(args)), g_(std::move(globals)) {}

  int Run() {
    const std::vector<std::string>& p = args_.positional;
    if (p.empty() || p[0] == "help" || args_.switches.count("help") > 0) {
      *env_.out << UsageText();
      return p.empty() && args_.switches.count("help") == 0 ? 2 : 0;
    }
    const std::string& cmd = p[0];
    const std::string sub = p.size() > 1 ? p[1] : "";
    if (cmd == "task") {
      if (sub == "create") return TaskCreate();
      if (sub == "list") return TaskList();
      if (sub == "status") return TaskStatusCmd();
      if (sub == "watch") return TaskWatch();
      if (sub == "stop") return TaskStop();
      return Fail(env_,
                  absl::StrCat("unknown command \"task ", sub,
                               "\" (expected create, list, status, watch, stop)"),
                  2);
    }
    if (cmd == "model") {
      if (sub == "get") return ModelGet();
      return Fail(env_, absl::StrCat("unknown command \"model ", sub, "\" (expected get)"), 2);
    }
    if (cmd == "local") return Local();
    if (cmd == "health") return Health();
    return Fail(env_, absl::StrCat("unknown command \"", cmd, "\"; run `shoalctl help`"), 2);
  }

 private:
  absl::StatusOr<std::unique_ptr<ControlClientInterface>> Client(const std::string& address) {
    return Client(address, g_.tls);
  }
  absl::StatusOr<std::unique_ptr<ControlClientInterface>> Client(const std::string& address,
                                                                 const rpc::TlsOptions& tls) {
    if (env_.make_client) return env_.make_client(address);
    SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(tls));
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> client,
                           ControlClient::Create(address, credentials.channel()));
    return std::unique_ptr<ControlClientInterface>(std::move(client));
  }

  int RpcFail(const absl::Status& status, const std::string& task_name) {
    return Fail(env_, DescribeRpcError(status, g_.coordinator, task_name, g_.timeout));
  }

  // Usage errors exit 2.
  int UsageFail(const absl::Status& status) { return Fail(env_, std::string(status.message()), 2); }

  int TaskCreate() {
    const std::string usage = "shoalctl task create FILE";
    if (absl::Status s = CheckArgs(args_, 2, 1, {}, usage); !s.ok()) return UsageFail(s);
    absl::StatusOr<common::v1::TaskSpec> spec = task::LoadTaskFile(args_.positional[2]);
    if (!spec.ok()) return Fail(env_, std::string(spec.status().message()));
    if (spec->join_token().empty()) spec->set_join_token(env_.default_join_token);
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    absl::StatusOr<TaskStatus> status = (*client)->CreateTask(*spec, g_.timeout);
    if (!status.ok()) return RpcFail(status.status(), "");
    *env_.out << "created task " << status->spec().name() << " (" << StateName(status->state())
              << ")\n";
    return 0;
  }

  int TaskList() {
    const std::string usage = "shoalctl task list [--json]";
    if (absl::Status s = CheckArgs(args_, 2, 0, {"json"}, usage); !s.ok()) return UsageFail(s);
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    absl::StatusOr<std::vector<TaskStatus>> tasks = (*client)->ListTasks(g_.timeout);
    if (!tasks.ok()) return RpcFail(tasks.status(), "");
    if (args_.switches.count("json") > 0) {
      std::vector<std::string> items;
      for (const TaskStatus& t : *tasks) items.push_back(TaskStatusToJson(t));
      *env_.out << "[" << absl::StrJoin(items, ",") << "]\n";
    } else {
      *env_.out << FormatTaskList(*tasks);
    }
    return 0;
  }

  int TaskStatusCmd() {
    const std::string usage = "shoalctl task status NAME [--json]";
    if (absl::Status s = CheckArgs(args_, 2, 1, {"json"}, usage); !s.ok()) return UsageFail(s);
    const std::string& name = args_.positional[2];
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    absl::StatusOr<TaskStatus> status = (*client)->GetTaskStatus(name, g_.timeout);
    if (!status.ok()) return RpcFail(status.status(), name);
    if (args_.switches.count("json") > 0) {
      *env_.out << TaskStatusToJson(*status) << "\n";
    } else {
      *env_.out << FormatTaskStatus(*status);
    }
    return 0;
  }

  int TaskStop() {
    const std::string usage = "shoalctl task stop NAME";
    if (absl::Status s = CheckArgs(args_, 2, 1, {}, usage); !s.ok()) return UsageFail(s);
    const std::string& name = args_.positional[2];
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    absl::StatusOr<TaskStatus> status = (*client)->StopTask(name, g_.timeout);
    if (!status.ok()) return RpcFail(status.status(), name);
    *env_.out << "task " << name << " " << StateName(status->state()) << "\n";
    return 0;
  }

  int TaskWatch() {
    const std::string usage = "shoalctl task watch NAME";
    if (absl::Status s = CheckArgs(args_, 2, 1, {}, usage); !s.ok()) return UsageFail(s);
    const std::string& name = args_.positional[2];
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    if (env_.interrupt != nullptr) env_.interrupt->graceful = true;
    ProgressPrinter printer(*env_.out, env_.out_is_tty, env_.tty_columns);
    absl::StatusOr<TaskStatus> final_status =
        WatchUntilEnd(**client, name, printer, env_, g_.coordinator);
    printer.Finish();
    if (!final_status.ok()) {
      if (final_status.status().code() == absl::StatusCode::kCancelled) return 130;
      return RpcFail(final_status.status(), name);
    }
    *env_.out << FormatSummary(*final_status);
    return final_status->state() == coordinator::v1::TASK_STATE_COMPLETED ? 0 : 1;
  }

  int ModelGet() {
    const std::string usage = "shoalctl model get NAME --out FILE|- [--version V]";
    if (absl::Status s = CheckArgs(args_, 2, 1, {"out", "version"}, usage); !s.ok()) {
      return UsageFail(s);
    }
    const std::string& name = args_.positional[2];
    auto out = args_.values.find("out");
    if (out == args_.values.end() || out->second.empty()) {
      return Fail(env_, absl::StrCat("--out FILE is required; usage: ", usage), 2);
    }
    std::optional<uint64_t> version;
    if (auto v = args_.values.find("version"); v != args_.values.end()) {
      uint64_t parsed = 0;
      if (!absl::SimpleAtoi(v->second, &parsed)) {
        return Fail(
            env_,
            absl::StrCat("--version: expected a model version number, got \"", v->second, "\""), 2);
      }
      version = parsed;
    }
    auto client = Client(g_.coordinator);
    if (!client.ok()) return UsageFail(client.status());
    if (env_.interrupt != nullptr) env_.interrupt->graceful = true;
    // A model can be large: unless --timeout was given, allow two minutes for the download.
    const absl::Duration timeout = g_.timeout_given ? g_.timeout : absl::Minutes(2);
    absl::StatusOr<DownloadedModel> model = (*client)->GetModel(
        name, version, timeout, env_.interrupt != nullptr ? &env_.interrupt->canceller : nullptr);
    if (!model.ok()) {
      if (model.status().code() == absl::StatusCode::kCancelled) return 130;
      if (model.status().code() == absl::StatusCode::kNotFound) {
        return Fail(env_, std::string(model.status().message()));
      }
      return Fail(env_, DescribeRpcError(model.status(), g_.coordinator, name, timeout));
    }
    // `--out -`: the model file goes to stdout (e.g. out of a container), the note to stderr.
    const bool to_stdout = out->second == "-";
    absl::Status written = to_stdout ? tensor::WriteModel(env_.out_fd, model->model, "stdout")
                                     : tensor::WriteModelFile(out->second, model->model);
    if (!written.ok()) return Fail(env_, std::string(written.message()));
    *(to_stdout ? env_.err : env_.out)
        << "wrote " << name << " version " << model->meta.version() << " ("
        << model->model.layout.num_tensors() << " tensors, " << model->model.layout.total_elements()
        << " parameters, " << model->model.layout.total_bytes() << " bytes) to "
        << (to_stdout ? "stdout" : out->second) << "\n";
    return 0;
  }

  // grpc.health.v1.Health/Check against any Shoal service: the container health probe.
  int Health() {
    const std::string usage =
        "shoalctl health --target HOST:PORT [--service NAME] [--tls-dir DIR | --insecure]";
    if (absl::Status s = CheckArgs(args_, 1, 0, {"target", "service"}, usage); !s.ok()) {
      return UsageFail(s);
    }
    auto target = args_.values.find("target");
    if (target == args_.values.end() || target->second.empty()) {
      return Fail(env_, absl::StrCat("--target HOST:PORT is required; usage: ", usage), 2);
    }
    if (absl::StatusOr<HostPort> parsed = ParseHostPort(target->second, "--target");
        !parsed.ok() || parsed->port == 0) {
      return Fail(env_,
                  parsed.ok() ? absl::StrCat("--target: expected HOST:PORT with a port, got \"",
                                             target->second, "\"")
                              : std::string(parsed.status().message()),
                  2);
    }
    const std::string service =
        args_.values.count("service") > 0 ? args_.values["service"] : std::string();
    absl::StatusOr<rpc::Credentials> credentials = rpc::Credentials::Create(g_.tls);
    if (!credentials.ok()) return UsageFail(credentials.status());
    auto stub =
        grpc::health::v1::Health::NewStub(rpc::MakeChannel(target->second, credentials->channel()));
    grpc::ClientContext context;
    rpc::SetTimeout(context, g_.timeout);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    const std::string what =
        service.empty() ? target->second : absl::StrCat(target->second, " service ", service);
    if (!status.ok()) {
      switch (status.error_code()) {
        case grpc::StatusCode::NOT_FOUND:
          return Fail(env_, absl::StrCat(what, ": no such service (", status.error_message(), ")"));
        case grpc::StatusCode::DEADLINE_EXCEEDED:
          return Fail(env_, absl::StrCat(what, " did not answer within ",
                                         absl::FormatDuration(g_.timeout)));
        default:
          return Fail(env_, absl::StrCat("health check of ", what, " failed: ",
                                         status.error_message().empty()
                                             ? std::to_string(status.error_code())
                                             : status.error_message()));
      }
    }
    const std::string state =
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
    if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      return Fail(env_, absl::StrCat(what, " is ", state));
    }
    *env_.out << what << " is " << state << "\n";
    return 0;
  }

  int Local();

  Environment& env_;
  Args args_;
  Globals g_;
};

int Shoalctl::Local() {
  const std::string usage =
      "shoalctl local --peers N --task FILE [--aggregators N] [--data-dir DIR] [--state-dir DIR] "
      "[--bin-dir DIR] [--startup-timeout 60s] [--keep-going] [--insecure]";
  if (absl::Status s = CheckArgs(args_, 1, 0,
                                 {"peers", "task", "aggregators", "data-dir", "state-dir",
                                  "bin-dir", "startup-timeout", "keep-going"},
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

  // Check the task before starting anything.
  absl::StatusOr<common::v1::TaskSpec> spec = task::LoadTaskFile(args_.values["task"]);
  if (!spec.ok()) return Fail(env_, std::string(spec.status().message()));
  if (spec->join_token().empty()) spec->set_join_token(env_.default_join_token);
  if (!spec->join_token().empty()) {
    options.peer_args.push_back("--join-token");
    options.peer_args.push_back(spec->join_token());
  }
  // Decentralized and gossip tasks need no aggregator: start none unless asked for.
  const bool needs_aggregator = task::ModeUsesAggregator(spec->mode());
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

  options.data_dir =
      args_.values.count("data-dir") > 0 ? args_.values["data-dir"] : kDefaultDataDir;
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

}  // namespace

absl::StatusOr<Args> ParseArgs(const std::vector<std::string>& argv) {
  Args args;
  bool flags_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (flags_done || a.size() < 2 || a[0] != '-') {
      args.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    if (a == "-h") {
      args.switches.insert("help");
      continue;
    }
    if (!absl::StartsWith(a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (SwitchFlags().count(name) > 0) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      args.switches.insert(name);
      continue;
    }
    if (ValueFlags().count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value.has_value()) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values[name] = *value;
  }
  return args;
}

std::string DescribeRpcError(const absl::Status& status, const std::string& coordinator,
                             const std::string& task_name, absl::Duration timeout) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      if (!task_name.empty()) return absl::StrCat("no task named ", task_name);
      break;
    case absl::StatusCode::kUnavailable:
      return absl::StrCat("cannot reach coordinator at ", coordinator, " (", status.message(), ")");
    case absl::StatusCode::kDeadlineExceeded:
      return absl::StrCat("coordinator at ", coordinator, " did not answer within ",
                          absl::FormatDuration(timeout));
    default:
      break;
  }
  return std::string(status.message().empty() ? status.ToString() : status.message());
}

std::string UsageText() {
  return R"(usage: shoalctl [--coordinator HOST:PORT] [--timeout 10s] <command>

Talks to a Shoal coordinator's ControlService (default 127.0.0.1:7000, or $SHOAL_COORDINATOR).

commands:
  task create FILE                 create a task from a YAML or JSON task file
  task list [--json]               list tasks
  task status NAME [--json]        show a task (--json: one JSON object)
  task watch NAME                  follow a task's rounds until it ends
  task stop NAME                   stop a task
  model get NAME --out FILE|- [--version V]
                                   download the task's global model (latest, or version V)
                                   into FILE, or to stdout with --out -
  local --peers N --task FILE [--aggregators N] [--data-dir DIR] [--state-dir DIR]
        [--bin-dir DIR] [--startup-timeout 60s] [--keep-going]
                                   run a whole cluster on 127.0.0.1 and train FILE's task
                                   (aggregators: default 1 for federated-sync, 0 for
                                   decentralized and gossip tasks)
  health --target HOST:PORT [--service NAME]
                                   gRPC health check of any Shoal service (grpc.health.v1);
                                   exits 0 only when it is SERVING (the container probe)
  help                             this text

global flags:
  --coordinator HOST:PORT          the coordinator to talk to
  --tls-dir DIR                    mutual TLS with DIR/{ca.crt,tls.crt,tls.key} (default
                                   $SHOAL_TLS_DIR); see scripts/gen-certs
  --insecure                       plaintext gRPC instead (for `local`: the whole cluster)
  --timeout DURATION               deadline of each call (default 10s; model get: 2m)
)";
}

int RunShoalctl(const std::vector<std::string>& argv, Environment& env) {
  absl::StatusOr<Args> args = ParseArgs(argv);
  if (!args.ok())
    return Fail(env, absl::StrCat(args.status().message(), "; run `shoalctl help`"), 2);
  Globals globals;
  globals.coordinator = env.default_coordinator;
  if (auto it = args->values.find("coordinator"); it != args->values.end()) {
    globals.coordinator = it->second;
  }
  globals.tls.dir = env.default_tls_dir;
  if (auto it = args->values.find("tls-dir"); it != args->values.end()) {
    globals.tls.dir = it->second;
  }
  if (args->switches.count("insecure") > 0) {
    globals.tls.insecure = true;
    if (args->values.count("tls-dir") == 0) globals.tls.dir.clear();  // the flag beats the env
  }
  if (auto it = args->values.find("timeout"); it != args->values.end()) {
    absl::StatusOr<absl::Duration> timeout = ParseDurationFlag("timeout", it->second);
    if (!timeout.ok()) return Fail(env, std::string(timeout.status().message()), 2);
    globals.timeout = *timeout;
    globals.timeout_given = true;
  }
  Interrupt fallback;
  if (env.interrupt == nullptr) env.interrupt = &fallback;
  Shoalctl shoalctl(env, *std::move(args), std::move(globals));
  const int code = shoalctl.Run();
  if (env.interrupt == &fallback) env.interrupt = nullptr;
  return code;
}

}  // namespace shoal::shoalctl
