// ControlClient and the shoalctl commands against a fake ControlService on 127.0.0.1:0.

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
namespace {

using coordinator::v1::TaskStatus;
using ::testing::HasSubstr;
using ::testing::Not;

tensor::FlatModel SmallModel() {
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

TaskStatus Status(const std::string& name, coordinator::v1::TaskState state, int rounds_done) {
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
TaskStatus SetUpHistory(FakeControlService& fake, const std::string& name, int rounds,
                        int in_memory, common::v1::Mode mode = common::v1::MODE_FEDERATED_SYNC) {
  TaskStatus status = Status(name, coordinator::v1::TASK_STATE_COMPLETED, rounds);
  status.mutable_spec()->set_rounds(rounds);
  status.mutable_spec()->set_mode(mode);
  fake.SetRounds(name, {status.history().begin(), status.history().end()});
  status.mutable_history()->DeleteSubrange(0, rounds - in_memory);
  fake.SetTask(status);
  return status;
}

std::vector<uint64_t> RoundNumbers(const std::vector<coordinator::v1::RoundSummary>& rounds) {
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

TEST_F(ControlClientTest, CreateGetListStop) {
  common::v1::TaskSpec spec = task::DefaultTaskSpec();
  spec.set_name("alpha");
  absl::StatusOr<TaskStatus> created = client_->CreateTask(spec, absl::Seconds(5));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->spec().name(), "alpha");
  EXPECT_EQ(created->state(), coordinator::v1::TASK_STATE_WAITING);

  absl::StatusOr<TaskStatus> got = client_->GetTaskStatus("alpha", absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec().SerializeAsString(), spec.SerializeAsString());

  absl::StatusOr<std::vector<TaskStatus>> list = client_->ListTasks(absl::Seconds(5));
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);

  absl::StatusOr<TaskStatus> stopped = client_->StopTask("alpha", absl::Seconds(5));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->state(), coordinator::v1::TASK_STATE_STOPPED);

  EXPECT_EQ(client_->GetTaskStatus("beta", absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  spec.set_batch_size(0);
  absl::StatusOr<TaskStatus> bad = client_->CreateTask(spec, absl::Seconds(5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("batch_size"));
}

TEST_F(ControlClientTest, WatchDeliversEveryStatusInOrder) {
  fake_.SetTask(Status("w", coordinator::v1::TASK_STATE_RUNNING, 0));
  fake_.SetWatchScript({Status("w", coordinator::v1::TASK_STATE_RUNNING, 0),
                        Status("w", coordinator::v1::TASK_STATE_RUNNING, 1),
                        Status("w", coordinator::v1::TASK_STATE_COMPLETED, 3)});
  std::vector<int> seen;
  absl::StatusOr<TaskStatus> last = client_->WatchTask(
      "w", absl::Seconds(10),
      [&](const TaskStatus& s) {
        seen.push_back(s.history_size());
        return true;
      },
      nullptr);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(last->state(), coordinator::v1::TASK_STATE_COMPLETED);

  EXPECT_EQ(client_
                ->WatchTask(
                    "nope", absl::Seconds(5), [](const TaskStatus&) { return true; }, nullptr)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ControlClientTest, WatchCanBeCancelledBeforeItStarts) {
  fake_.SetTask(Status("w", coordinator::v1::TASK_STATE_RUNNING, 0));
  Canceller canceller;
  canceller.Cancel();
  absl::StatusOr<TaskStatus> result = client_->WatchTask(
      "w", absl::Seconds(10), [](const TaskStatus&) { return true; }, &canceller);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
}

TEST_F(ControlClientTest, GetModelDecodesTheStream) {
  fake_.SetTask(Status("m", coordinator::v1::TASK_STATE_COMPLETED, 3));
  absl::StatusOr<DownloadedModel> model =
      client_->GetModel("m", std::nullopt, absl::Seconds(10), nullptr);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->meta.version(), 7u);
  EXPECT_EQ(model->model.values, SmallModel().values);
  EXPECT_EQ(model->model.layout, SmallModel().layout);
  EXPECT_EQ(client_->GetModel("m", 3, absl::Seconds(10), nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ControlClientTest, UnreachableCoordinatorIsUnavailable) {
  // Port 1 is privileged and nothing listens there.
  absl::StatusOr<std::unique_ptr<ControlClient>> client =
      ControlClient::Create("127.0.0.1:1", grpc::InsecureChannelCredentials());
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->ListTasks(absl::Seconds(5)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ControlClient::Create("no-port", grpc::InsecureChannelCredentials()).ok());
}

TEST_F(ControlClientTest, StatusJsonCommand) {
  fake_.SetTask(Status("j", coordinator::v1::TASK_STATE_RUNNING, 2));
  auto [code, out, err] = Shoalctl({"task", "status", "j", "--json"});
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  YAML::Node root = YAML::Load(out);
  EXPECT_EQ(root["name"].as<std::string>(), "j");
  EXPECT_EQ(root["mode"].as<std::string>(), "federated-sync");
  EXPECT_EQ(root["state"].as<std::string>(), "running");
  EXPECT_EQ(root["round"].as<int>(), 3);
  EXPECT_EQ(root["participants"].size(), 2u);
  ASSERT_EQ(root["history"].size(), 2u);
  EXPECT_DOUBLE_EQ(root["history"][1]["test_accuracy"].as<double>(), 0.7);
}

TEST_F(ControlClientTest, CommandsReportErrorsInOneLine) {
  {
    auto [code, out, err] = Shoalctl({"task", "status", "ghost"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: no task named ghost\n");
  }
  {
    auto [code, out, err] = Shoalctl({"--coordinator", "127.0.0.1:1", "task", "list"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("shoalctl: cannot reach coordinator at 127.0.0.1:1"));
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
  }
  {
    const std::string file =
        std::string(std::getenv("SHOAL_SOURCE_DIR")) + "/tests/data/tasks/bad_partition.yaml";
    auto [code, out, err] = Shoalctl({"task", "create", file});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("dataset.partition: unknown value \"foo\""));
  }
  {
    auto [code, out, err] = Shoalctl({"task", "frobnicate"});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(err, HasSubstr("unknown command"));
  }
  {
    auto [code, out, err] = Shoalctl({"model", "get", "x"});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(err, HasSubstr("--out FILE is required"));
  }
}

TEST_F(ControlClientTest, CreateListStopCommands) {
  const std::string file =
      std::string(std::getenv("SHOAL_SOURCE_DIR")) + "/tests/data/tasks/good.json";
  {
    auto [code, out, err] = Shoalctl({"task", "create", file});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "created task fmnist-json (waiting)\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "list"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("fmnist-json"));
  }
  {
    auto [code, out, err] = Shoalctl({"task", "stop", "fmnist-json"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "task fmnist-json stopped\n");
  }
}

TEST_F(ControlClientTest, WatchCommandPrintsOneLinePerChangeAndTheSummary) {
  fake_.SetTask(Status("w", coordinator::v1::TASK_STATE_RUNNING, 0));
  fake_.SetWatchScript({Status("w", coordinator::v1::TASK_STATE_RUNNING, 0),
                        Status("w", coordinator::v1::TASK_STATE_RUNNING, 0),  // no change
                        Status("w", coordinator::v1::TASK_STATE_RUNNING, 1),
                        Status("w", coordinator::v1::TASK_STATE_COMPLETED, 3)});
  auto [code, out, err] = Shoalctl({"task", "watch", "w"});
  EXPECT_EQ(code, 0) << err;
  EXPECT_THAT(out, HasSubstr("round 0/3 [------------------------]   0%  peers 2\n"));
  EXPECT_THAT(
      out,
      HasSubstr("round 1/3 [########----------------]  33%  peers 2  loss 1.0000  acc 0.6000\n"));
  EXPECT_THAT(out, HasSubstr("final test accuracy: 0.8000"));
  EXPECT_EQ(out.find("\r"), std::string::npos) << "not a terminal";
  EXPECT_THAT(out, Not(HasSubstr("training"))) << "no phase changes in a log";
  // The repeated status did not print a second identical line.
  EXPECT_EQ(out.find("round 0/3"), out.rfind("round 0/3"));
}

TEST_F(ControlClientTest, ListRoundsPagesThroughTheStoredRounds) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  absl::StatusOr<RoundsPage> page = client_->ListRounds("h", 0, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(page->more);
  EXPECT_DOUBLE_EQ(page->rounds[1].test_accuracy(), 0.7);
  EXPECT_EQ(page->rounds[1].participants_size(), 2);
  page = client_->ListRounds("h", 4, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{5}));
  EXPECT_FALSE(page->more);
  page = client_->ListRounds("h", 5, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->rounds.empty());
  EXPECT_FALSE(page->more);
  page = client_->ListRounds("h", 2, 1, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(page->more);
  const std::vector<FakeControlService::ListRoundsCall> calls = fake_.list_rounds_calls();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[3].name, "h");
  EXPECT_EQ(calls[3].after_round, 2u);
  EXPECT_EQ(calls[3].limit, 1u);
  // gRPC rounds the deadline it sends up a little.
  EXPECT_LT(calls[3].deadline_in, std::chrono::milliseconds(5500));

  EXPECT_EQ(client_->ListRounds("ghost", 0, 10, absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->ListRounds("h", 0, 1001, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ControlClientTest, HistoryCommandPrintsEveryRoundAcrossPages) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  auto [code, out, err] = Shoalctl({"task", "history", "h", "--timeout", "7s"});
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(out,
            "round  peers   dropped  train_loss  test_acc   duration\n"
            "    1  2             0      1.0000    0.6000       1.0s\n"
            "    2  2             0      0.5000    0.7000       1.0s\n"
            "    3  2             0      0.3333    0.8000       1.0s\n"
            "    4  2             0      0.2500    0.9000       1.0s\n"
            "    5  2             0      0.2000    1.0000       1.0s\n");
  EXPECT_EQ(err, "");
  // Pages of up to 1000 (the fake serves 2), each after the last round received, each with the
  // --timeout deadline.
  const std::vector<FakeControlService::ListRoundsCall> calls = fake_.list_rounds_calls();
  ASSERT_EQ(calls.size(), 3u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].after_round, 2 * i);
    EXPECT_EQ(calls[i].limit, 1000u);
    EXPECT_LT(calls[i].deadline_in, std::chrono::milliseconds(7500));  // not the default 10s
    EXPECT_GT(calls[i].deadline_in, std::chrono::seconds(0));
  }
}

TEST_F(ControlClientTest, HistoryCommandJsonRendersRoundsAsTaskStatusDoes) {
  const TaskStatus status = SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  auto [code, out, err] = Shoalctl({"task", "history", "h", "--json"});
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  YAML::Node rounds = YAML::Load(out);
  ASSERT_TRUE(rounds.IsSequence()) << out;
  ASSERT_EQ(rounds.size(), 5u);
  for (size_t i = 0; i < rounds.size(); ++i) {
    EXPECT_EQ(rounds[i]["round"].as<uint64_t>(), i + 1);
    EXPECT_EQ(rounds[i]["participants"].size(), 2u);
  }
  EXPECT_DOUBLE_EQ(rounds[2]["test_accuracy"].as<double>(), 0.8);
  // The rounds still in the status's history read exactly as in `task status --json`.
  auto [status_code, status_out, status_err] = Shoalctl({"task", "status", "h", "--json"});
  ASSERT_EQ(status_code, 0) << status_err;
  const std::string newest =
      absl::StrCat(RoundToJson(status.history(0)), ",", RoundToJson(status.history(1)));
  EXPECT_THAT(status_out, HasSubstr(absl::StrCat("\"history\":[", newest, "]")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(",", newest, "]\n")));
}

TEST_F(ControlClientTest, HistoryCommandAfterARound) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "3"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out,
              "round  peers   dropped  train_loss  test_acc   duration\n"
              "    4  2             0      0.2500    0.9000       1.0s\n"
              "    5  2             0      0.2000    1.0000       1.0s\n");
    ASSERT_FALSE(fake_.list_rounds_calls().empty());
    EXPECT_EQ(fake_.list_rounds_calls()[0].after_round, 3u);
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after=1", "--json"});
    ASSERT_EQ(code, 0) << err;
    YAML::Node rounds = YAML::Load(out);
    ASSERT_EQ(rounds.size(), 4u) << out;
    EXPECT_EQ(rounds[0]["round"].as<int>(), 2);
    EXPECT_EQ(rounds[3]["round"].as<int>(), 5);
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "5"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "round  peers   dropped  train_loss  test_acc   duration\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "9", "--json"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "[]\n");
  }
}

TEST_F(ControlClientTest, HistoryCommandShowsTheColumnsOfTheTasksMode) {
  SetUpHistory(fake_, "async", 3, 3, common::v1::MODE_FEDERATED_ASYNC);
  SetUpHistory(fake_, "dec", 3, 3, common::v1::MODE_DECENTRALIZED);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "async"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("version  updates  staleness"));
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "dec"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("joins  leaves  retries  removed"));
    EXPECT_THAT(out, HasSubstr("overhead"));
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  }
}

TEST_F(ControlClientTest, HistoryCommandErrors) {
  SetUpHistory(fake_, "h", 5, 2);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "ghost"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: no task named ghost\n");
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "ghost", "--json"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: no task named ghost\n");
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history"});
    EXPECT_EQ(code, 2);
    EXPECT_EQ(err, "shoalctl: usage: shoalctl task history NAME [--after R] [--json]\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "-1"});
    EXPECT_EQ(code, 2);
    EXPECT_EQ(err, "shoalctl: --after: expected a round number, got \"-1\"\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--version", "3"});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(err, HasSubstr("--version does not apply here"));
  }
  {
    auto [code, out, err] = Shoalctl({"--coordinator", "127.0.0.1:1", "task", "history", "h"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("shoalctl: cannot reach coordinator at 127.0.0.1:1"));
  }
  {
    // A server that keeps saying "more" without rounds ends the command instead of looping.
    fake_.SetStuck(true);
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--json"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("has rounds after round 0 but lists none"));
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"help"});
    EXPECT_EQ(code, 0);
    EXPECT_THAT(out, HasSubstr("task history NAME [--after R] [--json]"));
  }
}

TEST_F(ControlClientTest, ModelGetWritesAModelFile) {
  fake_.SetTask(Status("m", coordinator::v1::TASK_STATE_COMPLETED, 3));
  absl::StatusOr<std::string> dir = process::MakeTempDir("", "shoalctl-model-");
  ASSERT_TRUE(dir.ok());
  const std::string file = *dir + "/model.bin";
  {
    auto [code, out, err] = Shoalctl({"model", "get", "m", "--out", file});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("wrote m version 7 (2 tensors, 15 parameters"));
  }
  absl::StatusOr<tensor::FlatModel> read = tensor::ReadModelFile(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, SmallModel().values);
  {
    auto [code, out, err] = Shoalctl({"model", "get", "m", "--out", file, "--version", "4"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: task m has no checkpoint of version 4\n");
  }
  {
    // `--out -`: the file's bytes on the binary output, the note on stderr.
    const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    auto [code, out, err] = Shoalctl({"model", "get", "m", "--out", "-"}, fd);
    close(fd);
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "");
    EXPECT_THAT(err, HasSubstr("wrote m version 7 (2 tensors, 15 parameters"));
    absl::StatusOr<tensor::FlatModel> piped = tensor::ReadModelFile(file);
    ASSERT_TRUE(piped.ok()) << piped.status();
    EXPECT_EQ(piped->values, SmallModel().values);
  }
  unlink(file.c_str());
  rmdir(dir->c_str());
}

}  // namespace
}  // namespace shoal::shoalctl

namespace shoal::shoalctl {
namespace {

TEST(ParseArgsTest, FlagsAnywhereBothSpellingsLaterWins) {
  absl::StatusOr<Args> args = ParseArgs({"--coordinator", "a:1", "task", "status", "x", "--json",
                                         "--timeout=5s", "--coordinator=b:2", "--", "--odd"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->positional, (std::vector<std::string>{"task", "status", "x", "--odd"}));
  EXPECT_EQ(args->values["coordinator"], "b:2");
  EXPECT_EQ(args->values["timeout"], "5s");
  EXPECT_EQ(args->switches.count("json"), 1u);
}

TEST(ParseArgsTest, RejectsUnknownAndIncompleteFlags) {
  EXPECT_THAT(std::string(ParseArgs({"--frob"}).status().message()),
              HasSubstr("unknown flag --frob"));
  EXPECT_THAT(std::string(ParseArgs({"task", "list", "--timeout"}).status().message()),
              HasSubstr("--timeout needs a value"));
  EXPECT_THAT(std::string(ParseArgs({"--json=yes"}).status().message()),
              HasSubstr("--json takes no value"));
}

TEST(DescribeRpcErrorTest, MapsCodesToOneLine) {
  EXPECT_EQ(DescribeRpcError(absl::NotFoundError("x"), "h:1", "t", absl::Seconds(10)),
            "no task named t");
  EXPECT_EQ(DescribeRpcError(absl::UnavailableError("refused"), "h:1", "t", absl::Seconds(10)),
            "cannot reach coordinator at h:1 (refused)");
  EXPECT_EQ(DescribeRpcError(absl::DeadlineExceededError(""), "h:1", "", absl::Seconds(10)),
            "coordinator at h:1 did not answer within 10s");
  EXPECT_EQ(DescribeRpcError(absl::InvalidArgumentError("rounds: must be >= 1, got 0"), "h:1", "",
                             absl::Seconds(10)),
            "rounds: must be >= 1, got 0");
}

}  // namespace
}  // namespace shoal::shoalctl
