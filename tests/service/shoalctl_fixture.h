#pragma once

// What the shoalctl service tests share: a scripted ControlService on 127.0.0.1:0 and a fixture
// that runs ControlClient and the shoalctl commands against it.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/rpc/server.h"
#include "libs/task/task_file.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/model_file.h"
#include "services/shoalctl/commands.h"
#include "services/shoalctl/control_client.h"
#include "services/shoalctl/process.h"
#include "services/shoalctl/task_format.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace shoal::shoalctl {

using coordinator::v1::TaskStatus;

inline tensor::FlatModel SmallModel() {
  absl::StatusOr<tensor::ModelLayout> layout =
      tensor::ModelLayout::Create({{"fc.weight", {3, 4}}, {"fc.bias", {3}}});
  tensor::FlatModel model{*layout, std::vector<float>(15)};
  for (size_t i = 0; i < model.values.size(); ++i) model.values[i] = 0.5f * i;
  return model;
}

// A scripted coordinator. Thread-safe (gRPC's sync server calls from many threads).
class FakeControlService final : public coordinator::v1::ControlService::Service {
 public:
  grpc::Status CreateTask(grpc::ServerContext*, const coordinator::v1::CreateTaskRequest* request,
                          coordinator::v1::CreateTaskResponse* response) override {
    if (absl::Status s = task::ValidateTaskSpec(request->spec()); !s.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()));
    }
    absl::MutexLock lock(&mu_);
    TaskStatus& status = tasks_[request->spec().name()];
    *status.mutable_spec() = request->spec();
    status.set_state(coordinator::v1::TASK_STATE_WAITING);
    *response->mutable_status() = status;
    return grpc::Status::OK;
  }

  grpc::Status ListTasks(grpc::ServerContext*, const coordinator::v1::ListTasksRequest*,
                         coordinator::v1::ListTasksResponse* response) override {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, status] : tasks_) *response->add_tasks() = status;
    return grpc::Status::OK;
  }

  grpc::Status GetTaskStatus(grpc::ServerContext*,
                             const coordinator::v1::GetTaskStatusRequest* request,
                             coordinator::v1::GetTaskStatusResponse* response) override {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(request->name());
    if (it == tasks_.end()) return NotFound(request->name());
    *response->mutable_status() = it->second;
    return grpc::Status::OK;
  }

  grpc::Status StopTask(grpc::ServerContext*, const coordinator::v1::StopTaskRequest* request,
                        coordinator::v1::StopTaskResponse* response) override {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(request->name());
    if (it == tasks_.end()) return NotFound(request->name());
    it->second.set_state(coordinator::v1::TASK_STATE_STOPPED);
    *response->mutable_status() = it->second;
    return grpc::Status::OK;
  }

  grpc::Status DeleteTask(grpc::ServerContext*, const coordinator::v1::DeleteTaskRequest* request,
                          coordinator::v1::DeleteTaskResponse*) override {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(request->name());
    if (it == tasks_.end()) return NotFound(request->name());
    if (it->second.state() != coordinator::v1::TASK_STATE_STOPPED) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "open; stop it first");
    }
    tasks_.erase(it);
    return grpc::Status::OK;
  }

  // Streams the watch script, then ends the stream.
  grpc::Status WatchTask(grpc::ServerContext*, const coordinator::v1::WatchTaskRequest* request,
                         grpc::ServerWriter<coordinator::v1::WatchTaskResponse>* writer) override {
    std::vector<TaskStatus> script;
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.count(request->name()) == 0) return NotFound(request->name());
      script = watch_script_;
    }
    for (const TaskStatus& status : script) {
      coordinator::v1::WatchTaskResponse response;
      *response.mutable_status() = status;
      if (!writer->Write(response)) break;
    }
    return grpc::Status::OK;
  }

  // Like the coordinator's, but pages hold at most page_cap_ rounds, so a few rounds take
  // several calls; every request is recorded.
  grpc::Status ListRounds(grpc::ServerContext* context,
                          const coordinator::v1::ListRoundsRequest* request,
                          coordinator::v1::ListRoundsResponse* response) override {
    absl::MutexLock lock(&mu_);
    list_rounds_calls_.push_back({request->name(), request->after_round(), request->limit(),
                                  context->deadline() - std::chrono::system_clock::now()});
    if (tasks_.count(request->name()) == 0) return NotFound(request->name());
    if (request->limit() > 1000) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "limit: at most 1000 rounds per call");
    }
    if (stuck_) {  // a broken server: "more" without rounds
      response->set_more(true);
      return grpc::Status::OK;
    }
    const size_t limit =
        std::min<size_t>(request->limit() == 0 ? 100 : request->limit(), page_cap_);
    for (const auto& r : rounds_[request->name()]) {
      if (r.round() <= request->after_round()) continue;
      if (static_cast<size_t>(response->rounds_size()) == limit) {
        response->set_more(true);
        break;
      }
      *response->add_rounds() = r;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetModel(grpc::ServerContext*, const coordinator::v1::GetModelRequest* request,
                        grpc::ServerWriter<common::v1::ModelChunk>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.count(request->name()) == 0) return NotFound(request->name());
    }
    if (request->has_version() && request->version() != 7) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("task ", request->name(), " has no checkpoint of version ",
                                       request->version()));
    }
    const tensor::FlatModel model = SmallModel();
    common::v1::ModelChunk chunk;
    *chunk.mutable_meta() = tensor::MakeModelMeta(request->name(), 7, model);
    writer->Write(chunk);
    tensor::FrameEncoder encoder(model, /*chunk_bytes=*/16);  // several chunks per tensor
    chunk.Clear();
    while (encoder.Next(chunk.mutable_frame())) {
      writer->Write(chunk);
      chunk.Clear();
    }
    return grpc::Status::OK;
  }

  void SetTask(const TaskStatus& status) {
    absl::MutexLock lock(&mu_);
    tasks_[status.spec().name()] = status;
  }
  void SetWatchScript(std::vector<TaskStatus> script) {
    absl::MutexLock lock(&mu_);
    watch_script_ = std::move(script);
  }
  // The task's whole stored history (its TaskStatus.history may hold only the newest rounds).
  void SetRounds(const std::string& name, std::vector<coordinator::v1::RoundSummary> rounds) {
    absl::MutexLock lock(&mu_);
    rounds_[name] = std::move(rounds);
  }
  void SetPageCap(size_t cap) {
    absl::MutexLock lock(&mu_);
    page_cap_ = cap;
  }
  void SetStuck(bool stuck) {
    absl::MutexLock lock(&mu_);
    stuck_ = stuck;
  }

  struct ListRoundsCall {
    std::string name;
    uint64_t after_round;
    uint32_t limit;
    std::chrono::system_clock::duration deadline_in;  // time left until the call's deadline
  };
  std::vector<ListRoundsCall> list_rounds_calls() {
    absl::MutexLock lock(&mu_);
    return list_rounds_calls_;
  }

 private:
  static grpc::Status NotFound(const std::string& name) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no task named \"", name, "\""));
  }

  absl::Mutex mu_;
  std::map<std::string, TaskStatus> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<TaskStatus> watch_script_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<coordinator::v1::RoundSummary>> rounds_ ABSL_GUARDED_BY(mu_);
  size_t page_cap_ ABSL_GUARDED_BY(mu_) = 1000;
  bool stuck_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ListRoundsCall> list_rounds_calls_ ABSL_GUARDED_BY(mu_);
};

inline TaskStatus Status(const std::string& name, coordinator::v1::TaskState state,
                         int rounds_done) {
  TaskStatus s;
  *s.mutable_spec() = task::DefaultTaskSpec();
  s.mutable_spec()->set_name(name);
  s.mutable_spec()->set_rounds(3);
  s.set_state(state);
  s.set_phase(coordinator::v1::ROUND_PHASE_TRAINING);
  s.set_round(rounds_done + 1);
  s.add_participants("peer-0");
  s.add_participants("peer-1");
  for (int r = 1; r <= rounds_done; ++r) {
    auto* h = s.add_history();
    h->set_round(r);
    h->add_participants("peer-0");
    h->add_participants("peer-1");
    h->set_mean_train_loss(1.0 / r);
    h->set_evaluated(true);
    h->set_evaluation_complete(true);
    h->set_test_accuracy(0.5 + 0.1 * r);
    h->set_duration_ms(1000);
  }
  return s;
}

// A task with `rounds` finished rounds, all of them stored, of which its status holds only the
// newest `in_memory` (the coordinator's history window).
inline TaskStatus SetUpHistory(FakeControlService& fake, const std::string& name, int rounds,
                               int in_memory,
                               common::v1::Mode mode = common::v1::MODE_FEDERATED_SYNC) {
  TaskStatus status = Status(name, coordinator::v1::TASK_STATE_COMPLETED, rounds);
  status.mutable_spec()->set_rounds(rounds);
  status.mutable_spec()->set_mode(mode);
  fake.SetRounds(name, {status.history().begin(), status.history().end()});
  status.mutable_history()->DeleteSubrange(0, rounds - in_memory);
  fake.SetTask(status);
  return status;
}

inline std::vector<uint64_t> RoundNumbers(
    const std::vector<coordinator::v1::RoundSummary>& rounds) {
  std::vector<uint64_t> numbers;
  for (const auto& r : rounds) numbers.push_back(r.round());
  return numbers;
}

class ControlClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen = "127.0.0.1:0", .service_name = "fake-coordinator"}, {&fake_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    absl::StatusOr<std::unique_ptr<ControlClient>> client =
        ControlClient::Create(server_->address(), grpc::InsecureChannelCredentials());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  // Runs shoalctl (plaintext) against the fake; returns {exit code, stdout, stderr}.
  std::tuple<int, std::string, std::string> Shoalctl(std::vector<std::string> argv,
                                                     int out_fd = -1) {
    std::ostringstream out, err;
    Environment env;
    env.out = &out;
    env.err = &err;
    env.out_fd = out_fd;
    env.default_coordinator = server_->address();
    argv.push_back("--insecure");  // the fake serves plaintext
    const int code = RunShoalctl(argv, env);
    return {code, out.str(), err.str()};
  }

  FakeControlService fake_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<ControlClient> client_;
};

}  // namespace shoal::shoalctl
