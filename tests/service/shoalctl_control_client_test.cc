// ControlClient and the shoalctl commands against a fake ControlService on 127.0.0.1:0.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/service/shoalctl_fixture.h"
#include "tests/testing/temp_dir.h"

namespace shoal::shoalctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

// Straight into the file as it arrives: the model returned has no values; a download that
// fails leaves the file as it was and nothing beside it; a directory that is not there is named.
TEST_F(ControlClientTest, GetModelFileWritesTheFileAsTheModelArrives) {
  fake_.SetTask(Status("m", coordinator::v1::TASK_STATE_COMPLETED, 3));
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoalctl-model-file-");
  ASSERT_TRUE(dir.ok());
  const std::string file = *dir + "/model.bin";
  absl::StatusOr<DownloadedModel> model =
      client_->GetModelFile("m", std::nullopt, file, absl::Seconds(10), nullptr);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->meta.version(), 7u);
  EXPECT_EQ(model->model.layout, SmallModel().layout);
  EXPECT_TRUE(model->model.values.empty());
  absl::StatusOr<tensor::FlatModel> read = tensor::ReadModelFile(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, SmallModel().values);

  EXPECT_EQ(client_->GetModelFile("m", 4, file, absl::Seconds(10), nullptr).status().code(),
            absl::StatusCode::kNotFound);
  read = tensor::ReadModelFile(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, SmallModel().values);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(*dir)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("model.bin"));

  const absl::Status missing =
      client_->GetModelFile("m", std::nullopt, *dir + "/nope/model.bin", absl::Seconds(10), nullptr)
          .status();
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.message()), HasSubstr(*dir + "/nope"));
  std::filesystem::remove_all(*dir);
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

TEST_F(ControlClientTest, CreateListStopDeleteCommands) {
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
  {
    auto [code, out, err] = Shoalctl({"task", "delete", "fmnist-json"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "task fmnist-json deleted\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "delete", "fmnist-json"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("fmnist-json"));
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

TEST_F(ControlClientTest, ModelGetWritesAModelFile) {
  fake_.SetTask(Status("m", coordinator::v1::TASK_STATE_COMPLETED, 3));
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoalctl-model-");
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
