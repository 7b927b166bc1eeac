#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace shoal::coordinator::console {

// The console's view of the coordinator: each method is one ControlService call (or a few, for
// a task's pages of rounds) through `stub`, its response as JSON (protobuf's JSON mapping, proto
// field names, every field printed). Errors are the call's status as the coordinator gave it
// (NOT_FOUND, INVALID_ARGUMENT with the coordinator's message...), or INVALID_ARGUMENT naming
// the request's field when the console refuses it first. With coordinators that share their
// tasks, a task's calls go to the coordinator that serves it (`owners`). Thread-safe (the stubs
// are).
class ConsoleApi {
 public:
  // The ControlService of another coordinator, by the address it is named by; null when it
  // cannot be reached. The stubs outlive the ConsoleApi.
  using OwnerStubs = std::function<v1::ControlService::StubInterface*(const std::string& address)>;

  // `owners`: where a call about a task goes when `stub`'s coordinator answers that another one
  // serves it (null: nowhere; the answer is the error).
  explicit ConsoleApi(v1::ControlService::StubInterface& stub,
                      absl::Duration timeout = absl::Seconds(30), OwnerStubs owners = nullptr);

  // {"tasks": [{"status": TaskStatus, "latest_round": RoundSummary or null}]}: the newest
  // evaluated round, without its per-peer lists.
  absl::StatusOr<std::string> ListTasks();
  // {"status": TaskStatus, "rounds": [RoundSummary...]}: the status and the task's whole round
  // history (ListRounds pages), at most `max_rounds` of the newest rounds.
  absl::StatusOr<std::string> GetTask(const std::string& name, uint32_t max_rounds = 10000);
  // The text of a task file, parsed by the coordinator (CreateTaskRequest.task_file).
  absl::StatusOr<std::string> CreateTask(const std::string& task_file);
  absl::StatusOr<std::string> StopTask(const std::string& name);
  // DeleteTask: "{}" once the ended task is gone.
  absl::StatusOr<std::string> DeleteTask(const std::string& name);
  absl::StatusOr<std::string> ListNodes();

  // A model file (the format of `shoalctl model get --out`): streamed from GetModel, then
  // spooled to an unnamed temporary file, read from its start.
  struct ModelFile {
    uint64_t version = 0;
    uint64_t size = 0;
    std::unique_ptr<FILE, int (*)(FILE*)> file{nullptr, &std::fclose};
  };
  absl::StatusOr<ModelFile> GetModel(const std::string& name, std::optional<uint64_t> version);

  // The ControlService of the coordinator serving task `name` (this one's, or the owner that its
  // answer names) and, in `status`, the task's status there. Errors: GetTaskStatus's.
  absl::StatusOr<v1::ControlService::StubInterface*> StubServing(const std::string& name,
                                                                 v1::TaskStatus* status = nullptr);

 private:
  // Runs `call` on this coordinator's stub and, when the answer names the task's owner
  // (served_by.h), again on the owner's: the stub that answered, or the error.
  absl::StatusOr<v1::ControlService::StubInterface*> AtOwner(
      const std::function<absl::Status(v1::ControlService::StubInterface&)>& call);

  v1::ControlService::StubInterface& stub_;
  const absl::Duration timeout_;
  const OwnerStubs owners_;
};

// One WatchTask call read on its own thread, the newest status kept as JSON: the feed of a
// server-sent event stream. The destructor cancels the call and joins the thread.
class TaskWatch {
 public:
  // Opens the watch and waits up to `first_timeout` for the first status. Errors: the call's
  // (NOT_FOUND unknown task), DEADLINE_EXCEEDED when no status came in time.
  static absl::StatusOr<std::unique_ptr<TaskWatch>> Start(v1::ControlService::StubInterface& stub,
                                                          const std::string& name,
                                                          absl::Duration first_timeout);
  ~TaskWatch();
  TaskWatch(const TaskWatch&) = delete;
  TaskWatch& operator=(const TaskWatch&) = delete;

  struct Event {
    enum Kind { kStatus, kIdle, kEnd } kind = kIdle;
    std::string json;    // kStatus: the newest status (older ones not yet taken are skipped)
    absl::Status ended;  // kEnd: OK when the task ended, else why the stream ended
  };
  // The next status, or kIdle when none came within `timeout`, or kEnd once the stream is over.
  Event Next(absl::Duration timeout);
  // Ends the call (the server is stopping); Next returns kEnd from now on.
  void Cancel();

 private:
  TaskWatch() = default;
  void Read(std::unique_ptr<grpc::ClientReaderInterface<v1::WatchTaskResponse>> reader);

  grpc::ClientContext context_;
  absl::Mutex mu_;
  std::optional<std::string> latest_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
};

}  // namespace shoal::coordinator::console
