// The `task` commands: create, list, status, stop, watch.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/task/task_file.h"
#include "services/shoalctl/dispatcher.h"
#include "services/shoalctl/task_format.h"
#include "services/shoalctl/watch.h"

namespace shoal::shoalctl::internal {
namespace {

using coordinator::v1::TaskStatus;

}  // namespace

int Shoalctl::TaskCreate() {
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

int Shoalctl::TaskList() {
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

int Shoalctl::TaskStatusCmd() {
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

int Shoalctl::TaskStop() {
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

int Shoalctl::TaskWatch() {
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
}  // namespace shoal::shoalctl::internal
