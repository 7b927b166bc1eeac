#pragma once

#include <grpcpp/support/server_callback.h>

#include "libs/common/executor.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/task_store.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace shoal::coordinator {

// gRPC adapter for ControlService: thin handlers over CoordinatorCore. Thread-safe; the core
// must outlive it. GetModel is registered raw: a checkpoint goes out as slices of the model read
// from its file (rpc::ModelWriteReactor), never copied into protobuf messages.
class ControlServiceImpl final : public v1::ControlService::WithRawCallbackMethod_GetModel<
                                     v1::ControlService::CallbackService> {
 public:
  // Checkpoint reads (GetModel) run on `reads`, never on a gRPC thread.
  ControlServiceImpl(CoordinatorCore& core, TaskStore& store, Executor& reads,
                     CoordinatorMetrics& metrics)
      : core_(core), store_(store), reads_(reads), metrics_(metrics) {}

  grpc::ServerUnaryReactor* CreateTask(grpc::CallbackServerContext* context,
                                       const v1::CreateTaskRequest* request,
                                       v1::CreateTaskResponse* response) override;
  grpc::ServerUnaryReactor* ListTasks(grpc::CallbackServerContext* context,
                                      const v1::ListTasksRequest* request,
                                      v1::ListTasksResponse* response) override;
  grpc::ServerUnaryReactor* GetTaskStatus(grpc::CallbackServerContext* context,
                                          const v1::GetTaskStatusRequest* request,
                                          v1::GetTaskStatusResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchTaskResponse>* WatchTask(
      grpc::CallbackServerContext* context, const v1::WatchTaskRequest* request) override;
  grpc::ServerUnaryReactor* StopTask(grpc::CallbackServerContext* context,
                                     const v1::StopTaskRequest* request,
                                     v1::StopTaskResponse* response) override;
  grpc::ServerUnaryReactor* DeleteTask(grpc::CallbackServerContext* context,
                                       const v1::DeleteTaskRequest* request,
                                       v1::DeleteTaskResponse* response) override;
  grpc::ServerUnaryReactor* ListRounds(grpc::CallbackServerContext* context,
                                       const v1::ListRoundsRequest* request,
                                       v1::ListRoundsResponse* response) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const v1::ListNodesRequest* request,
                                      v1::ListNodesResponse* response) override;
  // A GetModelRequest that does not parse: INVALID_ARGUMENT.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetModel(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;

 private:
  // A NOT_FOUND about task `name` as the core's Routed says it (shared tasks: UNAVAILABLE
  // naming the coordinator that serves it).
  absl::StatusOr<v1::TaskStatus> Routed(absl::StatusOr<v1::TaskStatus> status,
                                        const std::string& name) const;

  CoordinatorCore& core_;
  TaskStore& store_;
  Executor& reads_;
  CoordinatorMetrics& metrics_;
};

}  // namespace shoal::coordinator
