// The web console against a real coordinator (in-process, gRPC and HTTP on 127.0.0.1 port 0),
// with real HTTP requests (cpp-httplib's client): credentials (401 before any lookup, 403 for
// a viewer's admin action), the coordinator's own errors (a bad task file's 400 carries the
// task-file parser's message), tasks created, listed and read, and the event stream.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/coordinator/coordinator_server.h"

namespace shoal::coordinator {
namespace {

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kViewer[] = "viewer-token-0123456789";
constexpr char kTask[] = R"(name: console-task
mode: federated-sync
model: mlp
dataset:
  partition: iid
rounds: 2
min_participants: 2
)";

class ConsoleServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);  // as shoal-coordinator: a closed connection is a write error
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-console-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string tokens = (dir_ / "tokens").string();
    std::ofstream(tokens) << "# the console's logins\nadmin " << kAdmin << "\nviewer " << kViewer
                          << "\n";
    CoordinatorServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.state_dir = (dir_ / "state").string();
    options.tls.insecure = true;
    options.console.listen = "127.0.0.1:0";
    options.console.tokens_file = tokens;
    options.console.keep_alive = absl::Milliseconds(100);  // a closed stream is found at once
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_NE(server_->console(), nullptr);
    client_ =
        std::make_unique<httplib::Client>(absl::StrCat("http://", server_->console()->address()));
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  static httplib::Headers Bearer(const std::string& token) {
    return {{"Authorization", absl::StrCat("Bearer ", token)}};
  }
  httplib::Result CreateTask(const std::string& token, const std::string& file) {
    return client_->Post("/api/tasks", Bearer(token), file, "application/yaml");
  }

  std::filesystem::path dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ConsoleServiceTest, ServesThePageWithoutCredential) {
  httplib::Result page = client_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_TRUE(absl::StrContains(page->get_header_value("Content-Type"), "text/html"));
  EXPECT_TRUE(absl::StrContains(page->body, "console.js"));
}

TEST_F(ConsoleServiceTest, RefusesMissingAndWrongCredentialsBeforeAnyLookup) {
  ASSERT_EQ(CreateTask(kAdmin, kTask)->status, 201);
  httplib::Result none = client_->Get("/api/tasks");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  // A wrong token gets the same answer for a task that exists and for one that does not.
  httplib::Result existing = client_->Get("/api/tasks/console-task", Bearer("wrong-token-000000"));
  httplib::Result missing = client_->Get("/api/tasks/no-such-task", Bearer("wrong-token-000000"));
  ASSERT_TRUE(existing && missing);
  EXPECT_EQ(existing->status, 401);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(existing->body, missing->body);
  httplib::Result cookie =
      client_->Get("/api/tasks/console-task", {{"Cookie", "shoal_console=made-up"}});
  ASSERT_TRUE(cookie);
  EXPECT_EQ(cookie->status, 401);
  EXPECT_EQ(cookie->body, missing->body);
  // With the right token, the missing task is a 404.
  httplib::Result found = client_->Get("/api/tasks/no-such-task", Bearer(kViewer));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->status, 404) << found->body;
}

TEST_F(ConsoleServiceTest, ViewerCannotCreateStopOrDelete) {
  httplib::Result create = CreateTask(kViewer, kTask);
  ASSERT_TRUE(create);
  EXPECT_EQ(create->status, 403) << create->body;
  EXPECT_EQ(client_->Get("/api/tasks", Bearer(kAdmin))->body, "{\"tasks\":[]}");
  ASSERT_EQ(CreateTask(kAdmin, kTask)->status, 201);
  httplib::Result stop =
      client_->Post("/api/tasks/console-task/stop", Bearer(kViewer), "", "text/plain");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 403) << stop->body;
  httplib::Result deleted = client_->Delete("/api/tasks/console-task", Bearer(kViewer));
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 403) << deleted->body;
}

TEST_F(ConsoleServiceTest, BadTaskFileIs400WithTheParsersMessage) {
  httplib::Result bad = CreateTask(kAdmin,
                                   "name: bad\nmode: federated-sync\ndataset:\n"
                                   "  partition: sideways\n");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_TRUE(absl::StrContains(bad->body, "task_file: dataset.partition")) << bad->body;
  EXPECT_TRUE(absl::StrContains(bad->body, "INVALID_ARGUMENT")) << bad->body;
  httplib::Result empty = CreateTask(kAdmin, "  \n");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 400);
  EXPECT_TRUE(absl::StrContains(empty->body, "task_file: empty")) << empty->body;
}

TEST_F(ConsoleServiceTest, LogsInWithACookieThenListsGetsAndStopsATask) {
  httplib::Result wrong = client_->Post("/api/login", "not-a-token-at-all", "text/plain");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  httplib::Result login = client_->Post("/api/login", kAdmin, "text/plain");
  ASSERT_TRUE(login);
  ASSERT_EQ(login->status, 200) << login->body;
  const std::string set_cookie = login->get_header_value("Set-Cookie");
  EXPECT_TRUE(absl::StrContains(set_cookie, "HttpOnly")) << set_cookie;
  EXPECT_TRUE(absl::StrContains(set_cookie, "SameSite=Strict")) << set_cookie;
  const httplib::Headers cookie = {{"Cookie", set_cookie.substr(0, set_cookie.find(';'))}};

  httplib::Result created = client_->Post("/api/tasks", cookie, kTask, "application/yaml");
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 201) << created->body;
  httplib::Result list = client_->Get("/api/tasks", cookie);
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_TRUE(absl::StrContains(list->body, "\"name\":\"console-task\"")) << list->body;
  httplib::Result task = client_->Get("/api/tasks/console-task", cookie);
  ASSERT_TRUE(task);
  EXPECT_EQ(task->status, 200);
  EXPECT_TRUE(absl::StrContains(task->body, "\"state\":\"TASK_STATE_WAITING\"")) << task->body;
  EXPECT_TRUE(absl::StrContains(task->body, "\"rounds\":[]")) << task->body;
  httplib::Result nodes = client_->Get("/api/nodes", cookie);
  ASSERT_TRUE(nodes);
  EXPECT_EQ(nodes->status, 200) << nodes->body;
  httplib::Result model = client_->Get("/api/tasks/console-task/model", cookie);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404) << model->body;  // no checkpoint yet
  httplib::Result stop = client_->Post("/api/tasks/console-task/stop", cookie, "", "text/plain");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 200) << stop->body;
  EXPECT_TRUE(absl::StrContains(stop->body, "TASK_STATE_STOPPED")) << stop->body;
  httplib::Result deleted = client_->Delete("/api/tasks/console-task", cookie);
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 200) << deleted->body;
  EXPECT_EQ(client_->Get("/api/tasks/console-task", cookie)->status, 404);

  ASSERT_EQ(client_->Post("/api/logout", cookie, "", "text/plain")->status, 200);
  EXPECT_EQ(client_->Get("/api/tasks", cookie)->status, 401);
}

TEST_F(ConsoleServiceTest, EventStreamDeliversTheTasksStatus) {
  ASSERT_EQ(CreateTask(kAdmin, kTask)->status, 201);
  std::string received;
  bool stopped = false;
  // Reads until the stream shows the stop made below, which ends it (the task has ended).
  httplib::Result events = client_->Get(
      "/api/tasks/console-task/events", Bearer(kViewer),
      [&](const httplib::Response& response) {
        EXPECT_EQ(response.status, 200);
        EXPECT_TRUE(
            absl::StrContains(response.get_header_value("Content-Type"), "text/event-stream"));
        return true;
      },
      [&](const char* data, size_t length) {
        received.append(data, length);
        if (!stopped && absl::StrContains(received, "event: status")) {
          stopped = true;
          httplib::Client other(absl::StrCat("http://", server_->console()->address()));
          EXPECT_EQ(
              other.Post("/api/tasks/console-task/stop", Bearer(kAdmin), "", "text/plain")->status,
              200);
        }
        return !absl::StrContains(received, "TASK_STATE_STOPPED");
      });
  EXPECT_TRUE(absl::StrContains(received, "event: status\ndata: {")) << received;
  EXPECT_TRUE(absl::StrContains(received, "\"name\":\"console-task\"")) << received;
  EXPECT_TRUE(absl::StrContains(received, "TASK_STATE_STOPPED")) << received;

  httplib::Result unknown = client_->Get("/api/tasks/no-such-task/events", Bearer(kViewer));
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404) << unknown->body;
}

TEST_F(ConsoleServiceTest, ClosingTheConnectionEndsTheEventStream) {
  ASSERT_EQ(CreateTask(kAdmin, kTask)->status, 201);
  // The task waits for peers: its stream would stay open; the client reads the first status
  // and hangs up.
  httplib::Result events = client_->Get("/api/tasks/console-task/events", Bearer(kViewer),
                                        [&](const char* data, size_t length) { return false; });
  EXPECT_FALSE(events);  // cancelled by the receiver
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->console()->event_streams() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server_->console()->event_streams(), 0u);
}

TEST_F(ConsoleServiceTest, ShutdownEndsAnOpenEventStream) {
  ASSERT_EQ(CreateTask(kAdmin, kTask)->status, 201);
  std::atomic<bool> open{false};
  std::thread reader([&] {
    httplib::Client client(absl::StrCat("http://", server_->console()->address()));
    client.set_read_timeout(30, 0);
    client.Get("/api/tasks/console-task/events", Bearer(kViewer),
               [&](const char* data, size_t length) {
                 if (absl::StrContains(absl::string_view(data, length), "event: status")) {
                   open = true;
                 }
                 return true;
               });
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!open && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(open);
  // The task runs on (waiting for peers): only Shutdown ends the stream, well within the
  // reader's 30 s timeout.
  const absl::Time start = absl::Now();
  server_->Shutdown();
  reader.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ConsoleStartTest, BadTokenFileStopsTheStartNamingTheLine) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("shoal-console-start-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string tokens = (dir / "tokens").string();
  std::ofstream(tokens) << "admin " << kAdmin << "\nroot " << kViewer << "\n";
  CoordinatorServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.state_dir = (dir / "state").string();
  options.tls.insecure = true;
  options.console.listen = "127.0.0.1:0";
  options.console.tokens_file = tokens;
  auto server = CoordinatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().message(),
            absl::StrCat("--console-tokens: ", tokens,
                         ":2: unknown role 'root' (expected admin or viewer)"));
  options.console.tokens_file.clear();
  server = CoordinatorServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::StartsWith(server.status().message(), "--console-tokens: required"))
      << server.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal::coordinator
