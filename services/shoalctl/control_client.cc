#include "services/shoalctl/control_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <filesystem>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/tensor/model_file.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace shoal::shoalctl {

using coordinator::v1::ControlService;
using coordinator::v1::TaskStatus;

void Canceller::Cancel() {
  std::function<void()> fn;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    fn = on_cancel_;
    running_ = static_cast<bool>(fn);
  }
  // Run outside the lock: TryCancel may call back into gRPC. Detach() waits for it, so the
  // call's context outlives it.
  if (fn) {
    fn();
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
}

bool Canceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool Canceller::Attach(std::function<void()> on_cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      on_cancel_ = std::move(on_cancel);
      return true;
    }
  }
  on_cancel();
  return false;
}

void Canceller::Detach() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* running) { return !*running; }, &running_));
  on_cancel_ = nullptr;
}

namespace {

// Attaches a call's context to a canceller for the duration of a scope.
class ScopedCancel {
 public:
  ScopedCancel(Canceller* canceller, grpc::ClientContext& context) : canceller_(canceller) {
    if (canceller_ != nullptr) canceller_->Attach([&context] { context.TryCancel(); });
  }
  ~ScopedCancel() {
    if (canceller_ != nullptr) canceller_->Detach();
  }

 private:
  Canceller* canceller_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Create(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  SHOAL_ASSIGN_OR_RETURN(
      std::unique_ptr<rpc::AddressList> coordinators,
      rpc::AddressList::Create(address, "--coordinator", std::move(credentials), "coordinator"));
  return std::unique_ptr<ControlClient>(new ControlClient(std::move(coordinators)));
}

ControlClient::ControlClient(std::unique_ptr<rpc::AddressList> coordinators)
    : coordinators_(std::move(coordinators)), address_(coordinators_->ToString()) {}

ControlClient::~ControlClient() = default;

namespace {

// A unary ControlService call at whichever coordinator serves, within `timeout` in all.
template <typename Request, typename Response>
absl::Status Unary(rpc::AddressList& coordinators, absl::Duration timeout,
                   grpc::Status (ControlService::Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                   const Request& request, Response& response) {
  return rpc::CallAny(coordinators, absl::Now() + timeout,
                      [&](const rpc::AddressList::Target& target, absl::Time deadline) {
                        grpc::ClientContext context;
                        context.set_deadline(absl::ToChronoTime(deadline));
                        response.Clear();
                        auto stub = ControlService::NewStub(target.channel);
                        return rpc::FromGrpcStatus(((*stub).*method)(&context, request, &response));
                      });
}

}  // namespace

absl::StatusOr<TaskStatus> ControlClient::CreateTask(const common::v1::TaskSpec& spec,
                                                     absl::Duration timeout) {
  coordinator::v1::CreateTaskRequest request;
  *request.mutable_spec() = spec;
  coordinator::v1::CreateTaskResponse response;
  SHOAL_RETURN_IF_ERROR(
      Unary(*coordinators_, timeout, &ControlService::Stub::CreateTask, request, response));
  return response.status();
}

absl::StatusOr<std::vector<TaskStatus>> ControlClient::ListTasks(absl::Duration timeout) {
  coordinator::v1::ListTasksResponse response;
  SHOAL_RETURN_IF_ERROR(Unary(*coordinators_, timeout, &ControlService::Stub::ListTasks,
                              coordinator::v1::ListTasksRequest(), response));
  return std::vector<TaskStatus>(response.tasks().begin(), response.tasks().end());
}

absl::StatusOr<coordinator::v1::ListNodesResponse> ControlClient::ListNodes(
    absl::Duration timeout) {
  coordinator::v1::ListNodesResponse response;
  SHOAL_RETURN_IF_ERROR(Unary(*coordinators_, timeout, &ControlService::Stub::ListNodes,
                              coordinator::v1::ListNodesRequest(), response));
  return response;
}

absl::StatusOr<TaskStatus> ControlClient::GetTaskStatus(const std::string& name,
                                                        absl::Duration timeout) {
  coordinator::v1::GetTaskStatusRequest request;
  request.set_name(name);
  coordinator::v1::GetTaskStatusResponse response;
  SHOAL_RETURN_IF_ERROR(
      Unary(*coordinators_, timeout, &ControlService::Stub::GetTaskStatus, request, response));
  return response.status();
}

absl::StatusOr<TaskStatus> ControlClient::StopTask(const std::string& name,
                                                   absl::Duration timeout) {
  coordinator::v1::StopTaskRequest request;
  request.set_name(name);
  coordinator::v1::StopTaskResponse response;
  SHOAL_RETURN_IF_ERROR(
      Unary(*coordinators_, timeout, &ControlService::Stub::StopTask, request, response));
  return response.status();
}

absl::Status ControlClient::DeleteTask(const std::string& name, absl::Duration timeout) {
  coordinator::v1::DeleteTaskRequest request;
  request.set_name(name);
  coordinator::v1::DeleteTaskResponse response;
  return Unary(*coordinators_, timeout, &ControlService::Stub::DeleteTask, request, response);
}

absl::StatusOr<TaskStatus> ControlClient::WatchTask(
    const std::string& name, absl::Duration timeout,
    const std::function<bool(const TaskStatus&)>& on_status, Canceller* canceller) {
  coordinator::v1::WatchTaskRequest request;
  request.set_name(name);
  std::optional<TaskStatus> last;
  bool stopped_by_caller = false;
  // A stream that broke after statuses came is the caller's to open again (an UNAVAILABLE after
  // statuses); one refused at once moves on to the next coordinator here.
  absl::Status status = rpc::CallAny(
      *coordinators_, absl::Now() + timeout,
      [&](const rpc::AddressList::Target& target, absl::Time deadline) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        ScopedCancel scoped(canceller, context);
        auto stub = ControlService::NewStub(target.channel);
        std::unique_ptr<grpc::ClientReader<coordinator::v1::WatchTaskResponse>> reader =
            stub->WatchTask(&context, request);
        coordinator::v1::WatchTaskResponse response;
        while (reader->Read(&response)) {
          last = response.status();
          if (!on_status(*last)) {
            stopped_by_caller = true;
            context.TryCancel();
            break;
          }
        }
        return rpc::FromGrpcStatus(reader->Finish());
      },
      [&](const absl::Status&) {
        return !last.has_value() && (canceller == nullptr || !canceller->cancelled());
      });
  if (stopped_by_caller) return *last;
  if (canceller != nullptr && canceller->cancelled()) {
    return absl::CancelledError("cancelled");
  }
  if (!status.ok()) return status;
  if (!last.has_value()) {
    return absl::InternalError(
        absl::StrCat("the coordinator ended the watch of ", name, " without sending a status"));
  }
  return *last;
}

absl::StatusOr<RoundsPage> ControlClient::ListRounds(const std::string& name, uint64_t after_round,
                                                     uint32_t limit, absl::Duration timeout) {
  coordinator::v1::ListRoundsRequest request;
  request.set_name(name);
  request.set_after_round(after_round);
  request.set_limit(limit);
  coordinator::v1::ListRoundsResponse response;
  SHOAL_RETURN_IF_ERROR(
      Unary(*coordinators_, timeout, &ControlService::Stub::ListRounds, request, response));
  RoundsPage page;
  page.rounds.assign(std::make_move_iterator(response.mutable_rounds()->begin()),
                     std::make_move_iterator(response.mutable_rounds()->end()));
  page.more = response.more();
  return page;
}

namespace {
coordinator::v1::GetModelRequest ModelRequest(const std::string& name,
                                              std::optional<uint64_t> version) {
  coordinator::v1::GetModelRequest request;
  request.set_name(name);
  if (version.has_value()) request.set_version(*version);
  return request;
}
}  // namespace

absl::StatusOr<DownloadedModel> ControlClient::ReadModel(
    const rpc::AddressList::Target& target, absl::Time deadline,
    const coordinator::v1::GetModelRequest& request, Canceller* canceller,
    tensor::WriteValues write) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  ScopedCancel scoped(canceller, context);
  // Read raw: each chunk is decoded straight from gRPC's slices, without a ModelChunk parsed
  // first (the server sends the same way, libs/rpc/model_stream.h).
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader = rpc::OpenRawReader(
      *target.channel, "/shoal.coordinator.v1.ControlService/GetModel", context, request);
  absl::StatusOr<tensor::ReceivedModel> received =
      rpc::ReadModelStream(*reader, tensor::DecoderLimits(), &context, std::move(write));
  if (!received.ok()) {
    if (canceller != nullptr && canceller->cancelled()) return absl::CancelledError("cancelled");
    return received.status();
  }
  return DownloadedModel{std::move(received->meta), std::move(received->model)};
}

absl::StatusOr<DownloadedModel> ControlClient::GetModel(const std::string& name,
                                                        std::optional<uint64_t> version,
                                                        absl::Duration timeout,
                                                        Canceller* canceller) {
  const coordinator::v1::GetModelRequest request = ModelRequest(name, version);
  return rpc::CallAny(*coordinators_, absl::Now() + timeout,
                      [&](const rpc::AddressList::Target& target, absl::Time deadline) {
                        return ReadModel(target, deadline, request, canceller, nullptr);
                      });
}

absl::StatusOr<DownloadedModel> ControlClient::GetModelFile(const std::string& name,
                                                            std::optional<uint64_t> version,
                                                            const std::string& path,
                                                            absl::Duration timeout,
                                                            Canceller* canceller) {
  const coordinator::v1::GetModelRequest request = ModelRequest(name, version);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return rpc::CallAny(*coordinators_, absl::Now() + timeout,
                      [&](const rpc::AddressList::Target& target,
                          absl::Time deadline) -> absl::StatusOr<DownloadedModel> {
                        // A file of its own for each attempt: one cut short leaves nothing behind.
                        SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<tensor::ModelFileWriter> file,
                                               tensor::ModelFileWriter::Create(dir));
                        SHOAL_ASSIGN_OR_RETURN(
                            DownloadedModel model,
                            ReadModel(target, deadline, request, canceller,
                                      [&file](size_t first, absl::Span<const float> values) {
                                        return file->Write(first, values);
                                      }));
                        SHOAL_RETURN_IF_ERROR(file->Commit(model.model.layout, path));
                        return model;
                      });
}

}  // namespace shoal::shoalctl
