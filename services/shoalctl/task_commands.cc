// The `task` commands: create, list, status, history, stop, watch.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/task/task_file.h"
#include "services/shoalctl/dispatcher.h"
#include "services/shoalctl/task_format.h"
#include "services/shoalctl/watch.h"

namespace shoal::shoalctl::internal {
namespace {

using coordinator::v1::RoundSummary;
using coordinator::v1::TaskStatus;

// Rounds per ListRounds call: the most the coordinator serves in one.
constexpr uint32_t kRoundsPerCall = 1000;

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

// Every stored round after --after, paging through ListRounds: TaskStatus.history holds only the
// newest ones. The output is printed once all pages are in, so a failure prints no partial table
// or JSON.
int Shoalctl::TaskHistory() {
  const std::string usage = "shoalctl task history NAME [--after R] [--json]";
  if (absl::Status s = CheckArgs(args_, 2, 1, {"after", "json"}, usage); !s.ok()) {
    return UsageFail(s);
  }
  const std::string& name = args_.positional[2];
  uint64_t after = 0;
  if (auto a = args_.values.find("after"); a != args_.values.end()) {
    if (!absl::SimpleAtoi(a->second, &after)) {
      return Fail(env_, absl::StrCat("--after: expected a round number, got \"", a->second, "\""),
                  2);
    }
  }
  const bool json = args_.switches.count("json") > 0;
  auto client = Client(g_.coordinator);
  if (!client.ok()) return UsageFail(client.status());
  // The table's columns depend on the task's mode; JSON has every field anyway.
  common::v1::Mode mode = common::v1::MODE_UNSPECIFIED;
  if (!json) {
    absl::StatusOr<TaskStatus> status = (*client)->GetTaskStatus(name, g_.timeout);
    if (!status.ok()) return RpcFail(status.status(), name);
    mode = status->spec().mode();
  }
  std::vector<RoundSummary> rounds;
  uint64_t from = after;
  while (true) {
    absl::StatusOr<RoundsPage> page = (*client)->ListRounds(name, from, kRoundsPerCall, g_.timeout);
    if (!page.ok()) return RpcFail(page.status(), name);
    const bool progressed = !page->rounds.empty() && page->rounds.back().round() > from;
    if (progressed) from = page->rounds.back().round();
    std::move(page->rounds.begin(), page->rounds.end(), std::back_inserter(rounds));
    if (!page->more) break;
    // "More" without moving past `from` would ask for the same page forever.
    if (!progressed) {
      return Fail(env_, absl::StrCat("coordinator at ", g_.coordinator, " says ", name,
                                     " has rounds after round ", from, " but lists none"));
    }
  }
  if (json) {
    std::vector<std::string> items;
    items.reserve(rounds.size());
    for (const RoundSummary& r : rounds) items.push_back(RoundToJson(r));
    *env_.out << "[" << absl::StrJoin(items, ",") << "]\n";
    return 0;
  }
  std::string table = FormatRoundTableHeader(mode);
  for (const RoundSummary& r : rounds) table += FormatRoundTableRow(mode, r);
  *env_.out << table;
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

int Shoalctl::TaskDelete() {
  const std::string usage = "shoalctl task delete NAME";
  if (absl::Status s = CheckArgs(args_, 2, 1, {}, usage); !s.ok()) return UsageFail(s);
  const std::string& name = args_.positional[2];
  auto client = Client(g_.coordinator);
  if (!client.ok()) return UsageFail(client.status());
  if (absl::Status s = (*client)->DeleteTask(name, g_.timeout); !s.ok()) return RpcFail(s, name);
  *env_.out << "task " << name << " deleted\n";
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
