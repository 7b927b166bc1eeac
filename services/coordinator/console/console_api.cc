#include "services/coordinator/console/console_api.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/tensor/model_file.h"
#include "services/coordinator/served_by.h"

namespace shoal::coordinator::console {
namespace {

constexpr uint32_t kRoundsPage = 1000;
// The task list shows the newest evaluated round of each task among its last kLatestRounds,
// for lists of at most kMaxTasksWithRounds tasks (one ListRounds call each).
constexpr uint32_t kLatestRounds = 4;
constexpr int kMaxTasksWithRounds = 200;

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("name: empty (the task's name)");
  return absl::OkStatus();
}

}  // namespace

ConsoleApi::ConsoleApi(v1::ControlService::StubInterface& stub, absl::Duration timeout,
                       OwnerStubs owners)
    : stub_(stub), timeout_(timeout), owners_(std::move(owners)) {}

absl::StatusOr<v1::ControlService::StubInterface*> ConsoleApi::AtOwner(
    const std::function<absl::Status(v1::ControlService::StubInterface&)>& call) {
  absl::Status here = call(stub_);
  if (here.ok()) return &stub_;
  std::optional<std::string> owner = ServingCoordinator(here);
  if (!owner.has_value() || owners_ == nullptr) return here;
  v1::ControlService::StubInterface* there = owners_(*owner);
  if (there == nullptr) return here;
  SHOAL_RETURN_IF_ERROR(call(*there));
  return there;
}

absl::StatusOr<v1::ControlService::StubInterface*> ConsoleApi::StubServing(const std::string& name,
                                                                           v1::TaskStatus* status) {
  SHOAL_RETURN_IF_ERROR(CheckName(name));
  v1::GetTaskStatusRequest request;
  request.set_name(name);
  auto ask = [&](v1::ControlService::StubInterface& stub) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, timeout_);
    v1::GetTaskStatusResponse response;
    absl::Status s = rpc::FromGrpcStatus(stub.GetTaskStatus(&context, request, &response));
    if (s.ok() && status != nullptr) *status = std::move(*response.mutable_status());
    return s;
  };
  return AtOwner(ask);
}

absl::StatusOr<std::string> ConsoleApi::ListTasks() {
  v1::ListTasksResponse response;
  {
    grpc::ClientContext context;
    rpc::SetTimeout(context, timeout_);
    SHOAL_RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub_.ListTasks(&context, v1::ListTasksRequest(), &response)));
  }
  // ListTasks omits the history: each task's newest evaluated round (of its last few) comes
  // from ListRounds, for the list's accuracy column.
  std::string tasks;
  for (const v1::TaskStatus& task : response.tasks()) {
    std::string latest = "null";
    if (task.round() > 0 && response.tasks_size() <= kMaxTasksWithRounds) {
      v1::ListRoundsRequest request;
      request.set_name(task.spec().name());
      request.set_after_round(task.round() > kLatestRounds ? task.round() - kLatestRounds : 0);
      request.set_limit(kLatestRounds);
      v1::ListRoundsResponse page;
      // Another coordinator's task: its rounds are there.
      const bool listed = AtOwner([&](v1::ControlService::StubInterface& stub) {
                            grpc::ClientContext context;
                            rpc::SetTimeout(context, timeout_);
                            return rpc::FromGrpcStatus(stub.ListRounds(&context, request, &page));
                          }).ok();
      // A task that went away since the list leaves its column empty.
      if (listed) {
        for (v1::RoundSummary& r : *page.mutable_rounds()) {
          if (!r.evaluated()) continue;
          r.clear_participants();
          r.clear_dropped();
          r.clear_late();
          r.clear_peer_times();
          latest = ToJson(r);
        }
      }
    }
    absl::StrAppend(&tasks, tasks.empty() ? "" : ",", "{\"status\":", ToJson(task),
                    ",\"latest_round\":", latest, "}");
  }
  return absl::StrCat("{\"tasks\":[", tasks, "]}");
}

absl::StatusOr<std::string> ConsoleApi::GetTask(const std::string& name, uint32_t max_rounds) {
  v1::TaskStatus status;
  SHOAL_ASSIGN_OR_RETURN(v1::ControlService::StubInterface * stub, StubServing(name, &status));
  // The newest max_rounds rounds: start that far before the current round.
  const uint64_t round = status.round();
  uint64_t after = round > max_rounds ? round - max_rounds : 0;
  std::string rounds;
  for (;;) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, timeout_);
    v1::ListRoundsRequest request;
    request.set_name(name);
    request.set_after_round(after);
    request.set_limit(kRoundsPage);
    v1::ListRoundsResponse page;
    SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->ListRounds(&context, request, &page)));
    for (const v1::RoundSummary& r : page.rounds()) {
      absl::StrAppend(&rounds, rounds.empty() ? "" : ",", ToJson(r));
      after = r.round();
    }
    if (!page.more() || page.rounds().empty()) break;
  }
  return absl::StrCat("{\"status\":", ToJson(status), ",\"rounds\":[", rounds, "]}");
}

absl::StatusOr<std::string> ConsoleApi::CreateTask(const std::string& task_file) {
  if (task_file.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("task_file: empty (paste or upload a task file)");
  }
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout_);
  v1::CreateTaskRequest request;
  request.set_task_file(task_file);
  v1::CreateTaskResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.CreateTask(&context, request, &response)));
  return ToJson(response.status());
}

absl::StatusOr<std::string> ConsoleApi::StopTask(const std::string& name) {
  SHOAL_ASSIGN_OR_RETURN(v1::ControlService::StubInterface * stub, StubServing(name));
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout_);
  v1::StopTaskRequest request;
  request.set_name(name);
  v1::StopTaskResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->StopTask(&context, request, &response)));
  return ToJson(response.status());
}

absl::StatusOr<std::string> ConsoleApi::DeleteTask(const std::string& name) {
  SHOAL_ASSIGN_OR_RETURN(v1::ControlService::StubInterface * stub, StubServing(name));
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout_);
  v1::DeleteTaskRequest request;
  request.set_name(name);
  v1::DeleteTaskResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->DeleteTask(&context, request, &response)));
  return std::string("{}");
}

absl::StatusOr<std::string> ConsoleApi::ListNodes() {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout_);
  v1::ListNodesResponse response;
  SHOAL_RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub_.ListNodes(&context, v1::ListNodesRequest(), &response)));
  return ToJson(response);
}

absl::StatusOr<ConsoleApi::ModelFile> ConsoleApi::GetModel(const std::string& name,
                                                           std::optional<uint64_t> version) {
  SHOAL_ASSIGN_OR_RETURN(v1::ControlService::StubInterface * stub, StubServing(name));
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Minutes(2));  // as `shoalctl model get`
  v1::GetModelRequest request;
  request.set_name(name);
  if (version.has_value()) request.set_version(*version);
  std::unique_ptr<grpc::ClientReaderInterface<common::v1::ModelChunk>> reader =
      stub->GetModel(&context, request);
  SHOAL_ASSIGN_OR_RETURN(tensor::ReceivedModel received,
                         rpc::ReadModelStream(*reader, tensor::DecoderLimits(), &context));
  ModelFile out;
  out.version = received.meta.version();
  out.file.reset(std::tmpfile());
  if (out.file == nullptr) return absl::InternalError("cannot make a temporary file for the model");
  SHOAL_RETURN_IF_ERROR(
      tensor::WriteModel(::fileno(out.file.get()), received.model, "a temporary file"));
  const off_t size = ::lseek(::fileno(out.file.get()), 0, SEEK_CUR);
  if (size < 0 || ::lseek(::fileno(out.file.get()), 0, SEEK_SET) != 0) {
    return absl::InternalError("cannot rewind the model's temporary file");
  }
  out.size = static_cast<uint64_t>(size);
  return out;
}

absl::StatusOr<std::unique_ptr<TaskWatch>> TaskWatch::Start(v1::ControlService::StubInterface& stub,
                                                            const std::string& name,
                                                            absl::Duration first_timeout) {
  SHOAL_RETURN_IF_ERROR(CheckName(name));
  std::unique_ptr<TaskWatch> watch(new TaskWatch());
  v1::WatchTaskRequest request;
  request.set_name(name);
  watch->reader_ =
      std::thread([w = watch.get(), reader = stub.WatchTask(&watch->context_, request)]() mutable {
        w->Read(std::move(reader));
      });
  absl::MutexLock lock(&watch->mu_);
  auto ready = [w = watch.get()]() { return w->latest_.has_value() || w->ended_; };
  if (!watch->mu_.AwaitWithTimeout(absl::Condition(&ready), first_timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("no status of task '", name, "' within ",
                                                    absl::FormatDuration(first_timeout)));
  }
  if (!watch->latest_.has_value()) {
    return watch->status_.ok() ? absl::NotFoundError(absl::StrCat("task '", name, "': no status"))
                               : watch->status_;
  }
  return watch;
}

void TaskWatch::Read(std::unique_ptr<grpc::ClientReaderInterface<v1::WatchTaskResponse>> reader) {
  v1::WatchTaskResponse response;
  while (reader->Read(&response)) {
    std::string json = ToJson(response.status());
    absl::MutexLock lock(&mu_);
    latest_ = std::move(json);
  }
  absl::Status status = rpc::FromGrpcStatus(reader->Finish());
  absl::MutexLock lock(&mu_);
  ended_ = true;
  status_ = std::move(status);
}

TaskWatch::~TaskWatch() {
  context_.TryCancel();
  if (reader_.joinable()) reader_.join();
}

void TaskWatch::Cancel() { context_.TryCancel(); }

TaskWatch::Event TaskWatch::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return latest_.has_value() || ended_; };
  Event event;
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return event;
  if (latest_.has_value()) {
    event.kind = Event::kStatus;
    event.json = *std::move(latest_);
    latest_.reset();
    return event;
  }
  event.kind = Event::kEnd;
  event.ended = status_;
  return event;
}

}  // namespace shoal::coordinator::console
