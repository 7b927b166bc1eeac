#include "services/coordinator/control_service.h"

#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/reactor_handle.h"
#include "libs/rpc/status.h"
#include "libs/task/task_file.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/model_file.h"
#include "services/coordinator/round_lists.h"

namespace shoal::coordinator {
namespace {

template <typename Response, typename T>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                     Response* response, void (*fill)(T&&, Response*)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) fill(*std::move(result), response);
  reactor->Finish(rpc::ToGrpcStatus(result.status()));
  return reactor;
}

// The same for a change an operator makes: answered once the core has stored it, so that a
// change the caller saw succeed survives a crash or a fail-over to a standby.
template <typename Response, typename T>
grpc::ServerUnaryReactor* FinishWhenStored(CoordinatorCore& core,
                                           grpc::CallbackServerContext* context,
                                           absl::StatusOr<T> result, Response* response,
                                           void (*fill)(T&&, Response*)) {
  if (!result.ok()) return FinishWith(context, std::move(result), response, fill);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  fill(*std::move(result), response);
  core.WhenStored([reactor] { reactor->Finish(grpc::Status::OK); });
  return reactor;
}

bool IsTerminal(v1::TaskState state) {
  return state == v1::TASK_STATE_COMPLETED || state == v1::TASK_STATE_STOPPED ||
         state == v1::TASK_STATE_FAILED;
}

// Streams status snapshots of one task. Only the newest pending snapshot is kept: a slow watcher
// skips intermediate states instead of buffering them. Finishes after a terminal state is written.
class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchTaskResponse> {
 public:
  explicit WatchReactor(CoordinatorCore& core)
      : core_(core), handle_(std::make_shared<rpc::ReactorHandle<WatchReactor>>(this)) {}

  void Start(const std::string& name) {
    std::weak_ptr<rpc::ReactorHandle<WatchReactor>> weak = handle_;
    absl::StatusOr<uint64_t> watch = core_.Watch(
        name,
        [weak](const v1::TaskStatus& status) {
          if (auto handle = weak.lock()) handle->Run([&](WatchReactor& r) { r.Push(status); });
        },
        [weak](const absl::Status& why) {
          if (auto handle = weak.lock()) handle->Run([&](WatchReactor& r) { r.End(why); });
        });
    if (!watch.ok()) {
      Finish(rpc::ToGrpcStatus(core_.Routed(watch.status(), name)));
      return;
    }
    absl::MutexLock lock(&mu_);
    watch_ = *watch;
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    bool write = false;
    grpc::Status end = grpc::Status::OK;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) {
        finish = !finished_;
        finished_ = true;
      } else if (pending_.has_value()) {
        write = PrepareWriteLocked();
      } else if ((last_was_terminal_ || ended_.has_value()) && !finished_) {
        finish = finished_ = true;
        if (ended_.has_value()) end = rpc::ToGrpcStatus(*ended_);
      }
    }
    if (write) StartWrite(&current_);
    if (finish) Finish(end);
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (!finished_ && !writing_) finish = finished_ = true;
      cancelled_ = true;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    std::optional<uint64_t> watch;
    {
      absl::MutexLock lock(&mu_);
      watch = watch_;
    }
    if (watch.has_value()) core_.Unwatch(*watch);
    std::shared_ptr<rpc::ReactorHandle<WatchReactor>> handle = std::move(handle_);
    handle->Detach();
  }

 private:
  void Push(const v1::TaskStatus& status) {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || cancelled_) return;
      pending_.emplace();
      *pending_->mutable_status() = status;
      if (!writing_) write = PrepareWriteLocked();
    }
    // Outside the lock: gRPC may run OnWriteDone inline.
    if (write) StartWrite(&current_);
  }

  // The task left this coordinator: the stream ends with `why` once the write in flight is done
  // (the statuses still pending are dropped: the next coordinator sends the current one).
  void End(const absl::Status& why) {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || cancelled_) return;
      ended_ = why;
      pending_.reset();
      if (!writing_) finish = finished_ = true;
    }
    if (finish) Finish(rpc::ToGrpcStatus(why));
  }

  // Moves the pending snapshot into the write buffer; the caller starts the write after
  // unlocking. `writing_` keeps current_ untouched until OnWriteDone.
  bool PrepareWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    current_ = std::move(*pending_);
    pending_.reset();
    last_was_terminal_ = IsTerminal(current_.status().state());
    writing_ = true;
    return true;
  }

  CoordinatorCore& core_;
  std::shared_ptr<rpc::ReactorHandle<WatchReactor>> handle_;
  absl::Mutex mu_;
  std::optional<uint64_t> watch_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::WatchTaskResponse> pending_ ABSL_GUARDED_BY(mu_);
  v1::WatchTaskResponse current_;  // written only while !writing_, under mu_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool last_was_terminal_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<v1::TaskStatus> ControlServiceImpl::Routed(absl::StatusOr<v1::TaskStatus> status,
                                                          const std::string& name) const {
  if (status.ok()) return status;
  return core_.Routed(status.status(), name);
}

grpc::ServerUnaryReactor* ControlServiceImpl::CreateTask(grpc::CallbackServerContext* context,
                                                         const v1::CreateTaskRequest* request,
                                                         v1::CreateTaskResponse* response) {
  absl::StatusOr<v1::TaskStatus> created =
      absl::InvalidArgumentError("task_file and spec: give one of them, not both");
  if (request->task_file().empty()) {
    created = core_.CreateTask(request->spec());
  } else if (!request->has_spec()) {
    absl::StatusOr<common::v1::TaskSpec> spec =
        task::ParseTaskSpec(request->task_file(), "task_file");
    created = spec.ok() ? core_.CreateTask(*spec) : spec.status();
  }
  return FinishWhenStored<v1::CreateTaskResponse, v1::TaskStatus>(
      core_, context, std::move(created), response,
      [](v1::TaskStatus&& s, v1::CreateTaskResponse* r) { *r->mutable_status() = std::move(s); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::ListTasks(grpc::CallbackServerContext* context,
                                                        const v1::ListTasksRequest* request,
                                                        v1::ListTasksResponse* response) {
  for (v1::TaskStatus& status : core_.ListTasks()) *response->add_tasks() = std::move(status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // As GetTaskStatus: once what the statuses show is stored.
  core_.WhenStored([reactor] { reactor->Finish(grpc::Status::OK); });
  return reactor;
}

grpc::ServerUnaryReactor* ControlServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                        const v1::ListNodesRequest* request,
                                                        v1::ListNodesResponse* response) {
  *response = core_.ListNodes();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ControlServiceImpl::GetTaskStatus(grpc::CallbackServerContext* context,
                                                            const v1::GetTaskStatusRequest* request,
                                                            v1::GetTaskStatusResponse* response) {
  // Answered once every change the status shows is stored: a model version a caller saw is
  // never lost to a crash of this coordinator (a round is stored before its version is shown
  // to peers, but the status in memory shows it at once).
  return FinishWhenStored<v1::GetTaskStatusResponse, v1::TaskStatus>(
      core_, context, Routed(core_.GetTaskStatus(request->name()), request->name()), response,
      [](v1::TaskStatus&& s, v1::GetTaskStatusResponse* r) {
        *r->mutable_status() = std::move(s);
      });
}

grpc::ServerUnaryReactor* ControlServiceImpl::StopTask(grpc::CallbackServerContext* context,
                                                       const v1::StopTaskRequest* request,
                                                       v1::StopTaskResponse* response) {
  return FinishWhenStored<v1::StopTaskResponse, v1::TaskStatus>(
      core_, context, Routed(core_.StopTask(request->name()), request->name()), response,
      [](v1::TaskStatus&& s, v1::StopTaskResponse* r) { *r->mutable_status() = std::move(s); });
}

grpc::ServerUnaryReactor* ControlServiceImpl::DeleteTask(grpc::CallbackServerContext* context,
                                                         const v1::DeleteTaskRequest* request,
                                                         v1::DeleteTaskResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Answered once the task is gone from the store.
  absl::Status s = core_.DeleteTask(request->name(), [reactor](const absl::Status& deleted) {
    reactor->Finish(rpc::ToGrpcStatus(deleted));
  });
  if (!s.ok()) reactor->Finish(rpc::ToGrpcStatus(core_.Routed(s, request->name())));
  return reactor;
}

grpc::ServerWriteReactor<v1::WatchTaskResponse>* ControlServiceImpl::WatchTask(
    grpc::CallbackServerContext* context, const v1::WatchTaskRequest* request) {
  auto* reactor = new WatchReactor(core_);
  reactor->Start(request->name());
  return reactor;
}

grpc::ServerUnaryReactor* ControlServiceImpl::ListRounds(grpc::CallbackServerContext* context,
                                                         const v1::ListRoundsRequest* request,
                                                         v1::ListRoundsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = core_.CheckTaskExists(request->name()); !s.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(core_.Routed(s, request->name())));
    return reactor;
  }
  if (request->limit() > 1000) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "limit: at most 1000 rounds per call"));
    return reactor;
  }
  const size_t limit = request->limit() == 0 ? 100 : request->limit();
  // A store read: on the reads executor. One round more than asked tells whether there are more.
  if (!reads_.TrySubmit([this, reactor, request, response, limit] {
        auto rounds = store_.LoadRounds(request->name(), request->after_round(), limit + 1);
        if (rounds.ok()) {
          // Whole rounds, as many as fit in the list budget (at least one): a page stays
          // within every client's message limit however many peers a round had.
          size_t entries = 0;
          size_t n = 0;
          while (n < rounds->size() && n < limit) {
            entries += ListEntries((*rounds)[n]);
            if (n > 0 && entries > kRoundListBudget) break;
            ++n;
          }
          response->set_more(rounds->size() > n);
          for (size_t i = 0; i < n; ++i) {
            v1::RoundSummary& r = (*rounds)[i];
            SetCounts(r, r);
            *response->add_rounds() = std::move(r);
          }
        }
        reactor->Finish(rpc::ToGrpcStatus(rounds.status()));
      })) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "too many reads in progress; retry later"));
  }
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlServiceImpl::GetModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  v1::GetModelRequest request;
  if (!rpc::ParseRawRequest(*raw_request, &request)) {
    return rpc::MakeFailedModelWriteReactor(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse GetModelRequest"));
  }
  if (absl::Status s = core_.CheckTaskExists(request.name()); !s.ok()) {
    return rpc::MakeFailedModelWriteReactor(rpc::ToGrpcStatus(core_.Routed(s, request.name())));
  }
  auto* reactor = new rpc::ModelWriteReactor(
      [this](uint64_t bytes, bool) { metrics_.bytes_sent.Increment(static_cast<double>(bytes)); });
  std::optional<uint64_t> version;
  if (request.has_version()) version = request.version();
  // The store lookup and the file's check (a pass over its values) block: they run on the reads
  // executor.
  if (!reads_.TrySubmit([this, reactor, name = request.name(), version] {
        absl::StatusOr<StoredCheckpoint> checkpoint = store_.GetCheckpoint(name, version);
        if (!checkpoint.ok()) {
          reactor->Fail(rpc::ToGrpcStatus(checkpoint.status()));
          return;
        }
        // Served from the file's pages (mapped, checked once), never from a heap copy.
        absl::StatusOr<std::shared_ptr<const tensor::MappedModelFile>> file =
            tensor::MappedModelFile::Open(checkpoint->path);
        if (!file.ok()) {
          reactor->Fail(rpc::ToGrpcStatus(file.status()));
          return;
        }
        common::v1::ModelMeta meta =
            tensor::MakeModelMeta(name, checkpoint->version, (*file)->layout());
        reactor->Start(tensor::EncodeRaw(*std::move(file)), std::move(meta));
      })) {
    reactor->Fail(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               "too many model downloads in progress; retry later"));
  }
  return reactor;
}

}  // namespace shoal::coordinator
