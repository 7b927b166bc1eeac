// The web console's plain classes with a fake ControlService stub: the token file and sessions,
// ConsoleApi's calls (ListRounds pages, the task list's newest evaluated round, the
// coordinator's errors passed through) and TaskWatch's events.

#include "services/coordinator/console/console_api.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "services/coordinator/console/console_auth.h"
#include "services/coordinator/console/console_server.h"

namespace shoal::coordinator::console {
namespace {

using v1::ControlService;

// Reads `responses`, then finishes with `status`.
template <typename R>
class FakeReader : public grpc::ClientReaderInterface<R> {
 public:
  FakeReader(std::deque<R> responses, grpc::Status status)
      : responses_(std::move(responses)), status_(std::move(status)) {}
  bool Read(R* out) override {
    if (responses_.empty()) return false;
    *out = std::move(responses_.front());
    responses_.pop_front();
    return true;
  }
  grpc::Status Finish() override { return status_; }
  bool NextMessageSize(uint32_t* size) override {
    *size = 1 << 20;
    return !responses_.empty();
  }
  void WaitForInitialMetadata() override {}

 private:
  std::deque<R> responses_;
  grpc::Status status_;
};

#define SHOAL_UNUSED_ASYNC(Method, Request, Response)                                \
  grpc::ClientAsyncResponseReaderInterface<v1::Response>* Async##Method##Raw(        \
      grpc::ClientContext*, const v1::Request&, grpc::CompletionQueue*) override {   \
    return nullptr;                                                                  \
  }                                                                                  \
  grpc::ClientAsyncResponseReaderInterface<v1::Response>* PrepareAsync##Method##Raw( \
      grpc::ClientContext*, const v1::Request&, grpc::CompletionQueue*) override {   \
    return nullptr;                                                                  \
  }

// A coordinator with one task of `rounds` rounds (every other one evaluated), or errors.
class FakeStub : public ControlService::StubInterface {
 public:
  uint64_t rounds = 0;
  grpc::Status error = grpc::Status::OK;  // what every call answers when not OK
  std::vector<v1::ListRoundsRequest> round_calls;
  int create_calls = 0;
  std::deque<v1::WatchTaskResponse> watch;

  grpc::Status CreateTask(grpc::ClientContext*, const v1::CreateTaskRequest& request,
                          v1::CreateTaskResponse* response) override {
    ++create_calls;
    if (!error.ok()) return error;
    response->mutable_status()->mutable_spec()->set_name("made");
    return grpc::Status::OK;
  }
  grpc::Status ListTasks(grpc::ClientContext*, const v1::ListTasksRequest&,
                         v1::ListTasksResponse* response) override {
    *response->add_tasks() = Status();
    return error;
  }
  grpc::Status GetTaskStatus(grpc::ClientContext*, const v1::GetTaskStatusRequest& request,
                             v1::GetTaskStatusResponse* response) override {
    if (!error.ok()) return error;
    *response->mutable_status() = Status();
    return grpc::Status::OK;
  }
  grpc::Status StopTask(grpc::ClientContext*, const v1::StopTaskRequest&,
                        v1::StopTaskResponse*) override {
    return error;
  }
  grpc::Status DeleteTask(grpc::ClientContext*, const v1::DeleteTaskRequest&,
                          v1::DeleteTaskResponse*) override {
    return error;
  }
  grpc::Status ListRounds(grpc::ClientContext*, const v1::ListRoundsRequest& request,
                          v1::ListRoundsResponse* response) override {
    round_calls.push_back(request);
    const uint64_t limit = request.limit() == 0 ? 100 : request.limit();
    uint64_t r = request.after_round() + 1;
    for (; r <= rounds && r <= request.after_round() + limit; ++r) {
      v1::RoundSummary* round = response->add_rounds();
      round->set_round(r);
      round->set_evaluated(r % 2 == 1);
      round->set_test_accuracy(r / 1000.0);
      round->add_participants("peer-0");
    }
    response->set_more(r <= rounds);
    return grpc::Status::OK;
  }
  grpc::Status ListNodes(grpc::ClientContext*, const v1::ListNodesRequest&,
                         v1::ListNodesResponse*) override {
    return error;
  }

 private:
  v1::TaskStatus Status() const {
    v1::TaskStatus status;
    status.mutable_spec()->set_name("t");
    status.set_round(rounds);
    return status;
  }
  grpc::ClientReaderInterface<v1::WatchTaskResponse>* WatchTaskRaw(
      grpc::ClientContext*, const v1::WatchTaskRequest&) override {
    return new FakeReader<v1::WatchTaskResponse>(watch, error);
  }
  grpc::ClientReaderInterface<common::v1::ModelChunk>* GetModelRaw(
      grpc::ClientContext*, const v1::GetModelRequest&) override {
    return new FakeReader<common::v1::ModelChunk>({}, error);
  }
  grpc::ClientAsyncReaderInterface<v1::WatchTaskResponse>* AsyncWatchTaskRaw(
      grpc::ClientContext*, const v1::WatchTaskRequest&, grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<v1::WatchTaskResponse>* PrepareAsyncWatchTaskRaw(
      grpc::ClientContext*, const v1::WatchTaskRequest&, grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<common::v1::ModelChunk>* AsyncGetModelRaw(
      grpc::ClientContext*, const v1::GetModelRequest&, grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  grpc::ClientAsyncReaderInterface<common::v1::ModelChunk>* PrepareAsyncGetModelRaw(
      grpc::ClientContext*, const v1::GetModelRequest&, grpc::CompletionQueue*) override {
    return nullptr;
  }
  SHOAL_UNUSED_ASYNC(CreateTask, CreateTaskRequest, CreateTaskResponse)
  SHOAL_UNUSED_ASYNC(ListTasks, ListTasksRequest, ListTasksResponse)
  SHOAL_UNUSED_ASYNC(GetTaskStatus, GetTaskStatusRequest, GetTaskStatusResponse)
  SHOAL_UNUSED_ASYNC(StopTask, StopTaskRequest, StopTaskResponse)
  SHOAL_UNUSED_ASYNC(DeleteTask, DeleteTaskRequest, DeleteTaskResponse)
  SHOAL_UNUSED_ASYNC(ListRounds, ListRoundsRequest, ListRoundsResponse)
  SHOAL_UNUSED_ASYNC(ListNodes, ListNodesRequest, ListNodesResponse)
};

TEST(TokenTableTest, FindsEachTokensRole) {
  auto table = TokenTable::Parse(
      "# logins\n\nadmin  aaaaaaaaaaaaaaaa\n  viewer\tbbbbbbbbbbbbbbbb  \n", "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->Find("aaaaaaaaaaaaaaaa"), Role::kAdmin);
  EXPECT_EQ(table->Find("bbbbbbbbbbbbbbbb"), Role::kViewer);
  EXPECT_EQ(table->Find("aaaaaaaaaaaaaaa"), std::nullopt);
  EXPECT_EQ(table->Find(""), std::nullopt);
}

TEST(TokenTableTest, ErrorsNameTheFileAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"admin aaaaaaaaaaaaaaaa\nroot bbbbbbbbbbbbbbbb\n", "tokens:2: unknown role 'root'"},
      {"admin short\n", "tokens:1: the token must be at least 16"},
      {"admin aaaaaaaaaaaaaaaa extra\n", "tokens:1: expected `ROLE TOKEN`"},
      {"admin aaaaaaaaaaaaaaaa\n#\nviewer aaaaaaaaaaaaaaaa\n", "tokens:3: this token is already"},
      {"# nothing\n", "tokens: no tokens"},
  };
  for (const auto& [text, message] : cases) {
    auto table = TokenTable::Parse(text, "tokens");
    ASSERT_FALSE(table.ok()) << text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(table.status().message(), message)) << table.status();
    EXPECT_TRUE(absl::StartsWith(table.status().message(), "--console-tokens: "));
  }
  EXPECT_EQ(TokenTable::Load("/nonexistent/tokens").status().code(), absl::StatusCode::kNotFound);
}

TEST(SessionTableTest, SessionsMapToRolesUntilRemovedOrExpired) {
  SessionTable sessions(absl::Hours(1), 2);
  auto a = sessions.Create(Role::kAdmin);
  auto b = sessions.Create(Role::kViewer);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(sessions.Find(*a), Role::kAdmin);
  EXPECT_EQ(sessions.Find(*b), Role::kViewer);
  EXPECT_EQ(sessions.Find("made-up"), std::nullopt);
  EXPECT_EQ(sessions.Find(""), std::nullopt);
  sessions.Remove(*a);
  EXPECT_EQ(sessions.Find(*a), std::nullopt);
  ASSERT_TRUE(sessions.Create(Role::kViewer).ok());
  ASSERT_TRUE(sessions.Create(Role::kViewer).ok());  // full: the oldest (b) goes
  EXPECT_EQ(sessions.Find(*b), std::nullopt);
  SessionTable expired(absl::ZeroDuration());
  auto c = expired.Create(Role::kAdmin);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(expired.Find(*c), std::nullopt);
}

TEST(ConsoleHttpTest, StatusCodesMapToHttpStatuses) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
}

TEST(ConsoleApiTest, GetTaskPagesThroughEveryRound) {
  FakeStub stub;
  stub.rounds = 2500;
  ConsoleApi api(stub);
  auto json = api.GetTask("t");
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_EQ(stub.round_calls.size(), 3u);
  EXPECT_EQ(stub.round_calls[1].after_round(), 1000u);
  EXPECT_TRUE(absl::StrContains(*json, "\"round\":\"2500\"")) << json->substr(0, 200);
  EXPECT_TRUE(absl::StrContains(*json, "\"round\":\"1\"")) << json->substr(0, 200);
  // At most max_rounds: the newest.
  stub.round_calls.clear();
  json = api.GetTask("t", 10);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(stub.round_calls[0].after_round(), 2490u);
  EXPECT_FALSE(absl::StrContains(*json, "\"round\":\"2490\""));
  EXPECT_TRUE(absl::StrContains(*json, "\"round\":\"2491\""));
}

TEST(ConsoleApiTest, ListTasksCarriesTheNewestEvaluatedRound) {
  FakeStub stub;
  stub.rounds = 10;  // round 9 is the newest evaluated one
  ConsoleApi api(stub);
  auto json = api.ListTasks();
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(absl::StrContains(*json, "\"latest_round\":{\"round\":\"9\"")) << *json;
  EXPECT_FALSE(absl::StrContains(*json, "peer-0")) << *json;  // lists left out
}

TEST(ConsoleApiTest, PassesTheCoordinatorsErrorsOn) {
  FakeStub stub;
  ConsoleApi api(stub);
  EXPECT_EQ(api.CreateTask(" \n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stub.create_calls, 0);  // refused before any call
  EXPECT_EQ(api.GetTask("").status().code(), absl::StatusCode::kInvalidArgument);
  stub.error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "task_file: rounds: must be > 0");
  auto created = api.CreateTask("name: x\n");
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(created.status().message(), "task_file: rounds: must be > 0");
  stub.error = grpc::Status(grpc::StatusCode::NOT_FOUND, "no task named \"x\"");
  EXPECT_EQ(api.GetTask("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(api.StopTask("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(api.DeleteTask("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(api.GetModel("x", std::nullopt).status().code(), absl::StatusCode::kNotFound);
}

TEST(TaskWatchTest, GivesTheStatusesThenTheEnd) {
  FakeStub stub;
  for (uint64_t round : {1, 2}) stub.watch.emplace_back().mutable_status()->set_round(round);
  auto watch = TaskWatch::Start(stub, "t", absl::Seconds(10));
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::string last;
  TaskWatch::Event event;
  // The reader may coalesce the two statuses: the newest one is never skipped.
  while ((event = (*watch)->Next(absl::Seconds(10))).kind == TaskWatch::Event::kStatus) {
    last = event.json;
  }
  EXPECT_TRUE(absl::StrContains(last, "\"round\":\"2\"")) << last;
  EXPECT_EQ(event.kind, TaskWatch::Event::kEnd);
  EXPECT_TRUE(event.ended.ok()) << event.ended;
}

TEST(TaskWatchTest, UnknownTaskFailsAtStart) {
  FakeStub stub;
  stub.error = grpc::Status(grpc::StatusCode::NOT_FOUND, "no task named \"t\"");
  auto watch = TaskWatch::Start(stub, "t", absl::Seconds(10));
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shoal::coordinator::console
