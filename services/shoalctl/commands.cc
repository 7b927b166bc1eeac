#include "services/shoalctl/commands.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/tensor/model_file.h"
#include "services/shoalctl/dispatcher.h"
#include "services/shoalctl/node_format.h"

namespace shoal::shoalctl {
namespace {

const std::set<std::string>& ValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "coordinator", "timeout",  "out",       "version", "peers",           "task",
      "aggregators", "data-dir", "state-dir", "bin-dir", "startup-timeout", "tls-dir",
      "target",      "service",  "after",     "format",  "model-dir",       "peer-data",
      "console"};
  return *flags;
}

const std::set<std::string>& SwitchFlags() {
  static const auto* flags = new std::set<std::string>{"json", "keep-going", "help", "insecure"};
  return *flags;
}

}  // namespace

namespace internal {

int Fail(Environment& env, const std::string& what, int code) {
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

int Shoalctl::Run() {
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
    if (sub == "history") return TaskHistory();
    if (sub == "watch") return TaskWatch();
    if (sub == "stop") return TaskStop();
    if (sub == "delete") return TaskDelete();
    return Fail(env_,
                absl::StrCat("unknown command \"task ", sub,
                             "\" (expected create, list, status, history, watch, stop, delete)"),
                2);
  }
  if (cmd == "model") {
    if (sub == "get") return ModelGet();
    return Fail(env_, absl::StrCat("unknown command \"model ", sub, "\" (expected get)"), 2);
  }
  if (cmd == "local") return Local();
  if (cmd == "health") return Health();
  if (cmd == "peers") return Peers();
  return Fail(env_, absl::StrCat("unknown command \"", cmd, "\"; run `shoalctl help`"), 2);
}

absl::StatusOr<std::unique_ptr<ControlClientInterface>> Shoalctl::Client(
    const std::string& address) {
  return Client(address, g_.tls);
}

absl::StatusOr<std::unique_ptr<ControlClientInterface>> Shoalctl::Client(
    const std::string& address, const rpc::TlsOptions& tls) {
  if (env_.make_client) return env_.make_client(address);
  SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(tls));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> client,
                         ControlClient::Create(address, credentials.channel()));
  return std::unique_ptr<ControlClientInterface>(std::move(client));
}

int Shoalctl::RpcFail(const absl::Status& status, const std::string& task_name) {
  return Fail(env_, DescribeRpcError(status, g_.coordinator, task_name, g_.timeout));
}

int Shoalctl::UsageFail(const absl::Status& status) {
  return Fail(env_, std::string(status.message()), 2);
}

// The connected peers and registered aggregators, with their capacity.
int Shoalctl::Peers() {
  const std::string usage = "shoalctl peers [--json]";
  if (absl::Status s = CheckArgs(args_, 1, 0, {"json"}, usage); !s.ok()) return UsageFail(s);
  auto client = Client(g_.coordinator);
  if (!client.ok()) return UsageFail(client.status());
  absl::StatusOr<coordinator::v1::ListNodesResponse> nodes = (*client)->ListNodes(g_.timeout);
  if (!nodes.ok()) return RpcFail(nodes.status(), "");
  *env_.out << (args_.switches.count("json") > 0 ? NodeListToJson(*nodes) + "\n"
                                                 : FormatNodeList(*nodes));
  return 0;
}

// grpc.health.v1.Health/Check against any Shoal service: the container health probe.
int Shoalctl::Health() {
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
        return Fail(
            env_, absl::StrCat(what, " did not answer within ", absl::FormatDuration(g_.timeout)));
      default:
        return Fail(
            env_, absl::StrCat("health check of ", what, " failed: ",
                               status.error_message().empty() ? std::to_string(status.error_code())
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

}  // namespace internal

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
  return R"(usage: shoalctl [--coordinator HOST:PORT[,HOST:PORT...]] [--timeout 10s] <command>

Talks to a Shoal coordinator's ControlService (default 127.0.0.1:7000, or $SHOAL_COORDINATOR).

commands:
  task create FILE                 create a task from a YAML or JSON task file
  task list [--json]               list tasks
  task status NAME [--json]        show a task and its newest 100 rounds (--json: one JSON
                                   object)
  task history NAME [--after R] [--json]
                                   every round of the task (after round R), as the table of
                                   `task watch` (--json: a JSON array of the rounds)
  task watch NAME                  follow a task's rounds until it ends
  task stop NAME                   stop a task
  task delete NAME                 delete an ended task with its rounds and checkpoints
  model get NAME --out FILE|- [--version V] [--format shoal|torchscript] [--model-dir DIR]
                                   download the task's global model (latest, or version V)
                                   into FILE, or to stdout with --out -. --format torchscript
                                   (a task whose model is a TorchScript file): write FILE as
                                   that TorchScript file with the trained weights, for
                                   torch.jit.load; the task's file is read from DIR (default:
                                   the working directory) and must have the task's SHA-256
  local --peers N --task FILE [--aggregators N] [--data-dir DIR | --peer-data DIR]
        [--state-dir DIR] [--bin-dir DIR] [--startup-timeout 60s] [--keep-going]
        [--console HOST:PORT]
                                   run a whole cluster on 127.0.0.1 and train FILE's task
                                   (aggregators: default 1 for federated-sync, 0 for
                                   decentralized and gossip tasks). --data-dir (default
                                   Fashion-MNIST's) is shared, peer I trains shard I/N of it;
                                   --peer-data DIR gives peer I its own DIR/peer-I;
                                   --console: the coordinator serves the web console there,
                                   with an admin token in STATE/console-tokens
  peers [--json]                   the connected peers and registered aggregators with their
                                   capacity: cores, matrix-multiply score (GFLOP/s, one core),
                                   memory (total, free), upload to the coordinator, and whether
                                   the coordinator can dial them (--json: one JSON object)
  health --target HOST:PORT [--service NAME]
                                   gRPC health check of any Shoal service (grpc.health.v1);
                                   exits 0 only when it is SERVING (the container probe)
  help                             this text

global flags:
  --coordinator HOST:PORT[,HOST:PORT...]
                                   the coordinator to talk to; several: an active one and
                                   its standbys, each call going to the one that serves
  --tls-dir DIR                    mutual TLS with DIR/{ca.crt,tls.crt,tls.key} (default
                                   $SHOAL_TLS_DIR); see scripts/gen-certs
  --insecure                       plaintext gRPC instead (for `local`: the whole cluster)
  --timeout DURATION               deadline of each call (default 10s; model get: 2m)
)";
}

int RunShoalctl(const std::vector<std::string>& argv, Environment& env) {
  using internal::Fail;
  absl::StatusOr<Args> args = ParseArgs(argv);
  if (!args.ok())
    return Fail(env, absl::StrCat(args.status().message(), "; run `shoalctl help`"), 2);
  internal::Globals globals;
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
    absl::StatusOr<absl::Duration> timeout = internal::ParseDurationFlag("timeout", it->second);
    if (!timeout.ok()) return Fail(env, std::string(timeout.status().message()), 2);
    globals.timeout = *timeout;
    globals.timeout_given = true;
  }
  Interrupt fallback;
  if (env.interrupt == nullptr) env.interrupt = &fallback;
  internal::Shoalctl shoalctl(env, *std::move(args), std::move(globals));
  const int code = shoalctl.Run();
  if (env.interrupt == &fallback) env.interrupt = nullptr;
  return code;
}

}  // namespace shoal::shoalctl
