#include "services/shoalctl/control_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <iterator>

#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
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

struct ControlClient::Stub {
  std::unique_ptr<ControlService::Stub> stub;
};

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Create(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  SHOAL_RETURN_IF_ERROR(ParseHostPort(address, "--coordinator").status());
  return std::unique_ptr<ControlClient>(
      new ControlClient(address, rpc::MakeChannel(address, std::move(credentials))));
}

ControlClient::ControlClient(std::string address, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(std::make_unique<Stub>(Stub{ControlService::NewStub(channel_)})) {}

ControlClient::~ControlClient() = default;

absl::StatusOr<TaskStatus> ControlClient::CreateTask(const common::v1::TaskSpec& spec,
                                                     absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::CreateTaskRequest request;
  *request.mutable_spec() = spec;
  coordinator::v1::CreateTaskResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->stub->CreateTask(&context, request, &response)));
  return response.status();
}

absl::StatusOr<std::vector<TaskStatus>> ControlClient::ListTasks(absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::ListTasksResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(
      stub_->stub->ListTasks(&context, coordinator::v1::ListTasksRequest(), &response)));
  return std::vector<TaskStatus>(response.tasks().begin(), response.tasks().end());
}

absl::StatusOr<coordinator::v1::ListNodesResponse> ControlClient::ListNodes(
    absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::ListNodesResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(
      stub_->stub->ListNodes(&context, coordinator::v1::ListNodesRequest(), &response)));
  return response;
}

absl::StatusOr<TaskStatus> ControlClient::GetTaskStatus(const std::string& name,
                                                        absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::GetTaskStatusRequest request;
  request.set_name(name);
  coordinator::v1::GetTaskStatusResponse response;
  SHOAL_RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub_->stub->GetTaskStatus(&context, request, &response)));
  return response.status();
}

absl::StatusOr<TaskStatus> ControlClient::StopTask(const std::string& name,
                                                   absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::StopTaskRequest request;
  request.set_name(name);
  coordinator::v1::StopTaskResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->stub->StopTask(&context, request, &response)));
  return response.status();
}

absl::StatusOr<TaskStatus> ControlClient::WatchTask(
    const std::string& name, absl::Duration timeout,
    const std::function<bool(const TaskStatus&)>& on_status, Canceller* canceller) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  ScopedCancel scoped(canceller, context);
  coordinator::v1::WatchTaskRequest request;
  request.set_name(name);
  std::unique_ptr<grpc::ClientReader<coordinator::v1::WatchTaskResponse>> reader =
      stub_->stub->WatchTask(&context, request);
  coordinator::v1::WatchTaskResponse response;
  std::optional<TaskStatus> last;
  bool stopped_by_caller = false;
  while (reader->Read(&response)) {
    last = response.status();
    if (!on_status(*last)) {
      stopped_by_caller = true;
      context.TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (stopped_by_caller) return *last;
  if (canceller != nullptr && canceller->cancelled()) {
    return absl::CancelledError("cancelled");
  }
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  if (!last.has_value()) {
    return absl::InternalError(
        absl::StrCat("the coordinator ended the watch of ", name, " without sending a status"));
  }
  return *last;
}

absl::StatusOr<RoundsPage> ControlClient::ListRounds(const std::string& name, uint64_t after_round,
                                                     uint32_t limit, absl::Duration timeout) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  coordinator::v1::ListRoundsRequest request;
  request.set_name(name);
  request.set_after_round(after_round);
  request.set_limit(limit);
  coordinator::v1::ListRoundsResponse response;
  SHOAL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->stub->ListRounds(&context, request, &response)));
  RoundsPage page;
  page.rounds.assign(std::make_move_iterator(response.mutable_rounds()->begin()),
                     std::make_move_iterator(response.mutable_rounds()->end()));
  page.more = response.more();
  return page;
}

absl::StatusOr<DownloadedModel> ControlClient::GetModel(const std::string& name,
                                                        std::optional<uint64_t> version,
                                                        absl::Duration timeout,
                                                        Canceller* canceller) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, timeout);
  ScopedCancel scoped(canceller, context);
  coordinator::v1::GetModelRequest request;
  request.set_name(name);
  if (version.has_value()) request.set_version(*version);
  // Read raw: each chunk is decoded straight from gRPC's slices, without a ModelChunk parsed
  // first (the server sends the same way, libs/rpc/model_stream.h).
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader = rpc::OpenRawReader(
      *channel_, "/shoal.coordinator.v1.ControlService/GetModel", context, request);
  absl::StatusOr<tensor::ReceivedModel> received =
      rpc::ReadModelStream(*reader, tensor::DecoderLimits(), &context);
  if (!received.ok()) {
    if (canceller != nullptr && canceller->cancelled()) return absl::CancelledError("cancelled");
    return received.status();
  }
  return DownloadedModel{std::move(received->meta), std::move(received->model)};
}

}  // namespace shoal::shoalctl
