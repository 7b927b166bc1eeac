// Real coordinators (in-process, gRPC on 127.0.0.1:0) that share their tasks on one etcd prefix
// (--share-tasks), against a real etcd member: they send callers of another's task to it, take
// its tasks over when it goes, share out aggregators and hand tasks to one that comes later.
// The ownership of tasks through the stores alone: task_ownership_test.cc.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "libs/rpc/status.h"
#include "services/aggregator/aggregator_server.h"
#include "services/coordinator/coordinator_server.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/etcd_suite.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kConsoleToken[] = "admin-token-0123456789";

// A task (decentralized by default) as its task file gives it, which only peers with
// `join_token` join (any peer: "").
std::string TaskFile(const std::string& name, const std::string& join_token = "token-of-a",
                     const std::string& mode = "decentralized") {
  return absl::StrCat("name: ", name, "\nmode: ", mode, R"(
model: mlp
dataset: {name: fashion-mnist, partition: iid}
optimizer: {kind: sgd, learning_rate: 0.05}
round_batches: 10
rounds: 3
min_participants: 2
)",
                      join_token.empty() ? "" : "join_token: " + join_token + "\n");
}

class SharedCoordinatorsTest : public testing::WithEtcdMember<> {
 protected:
  void SetUp() override {
    ASSERT_NE(etcd(), nullptr);
    absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-shared-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    url_ = absl::StrCat("etcd://", etcd()->endpoint(), NewPrefix("shared"));
  }
  // `console`: with its web console, whose admin token is kConsoleToken.
  std::unique_ptr<CoordinatorServer> StartCoordinator(const std::string& name,
                                                      bool console = false) {
    CoordinatorServerOptions options;
    if (console) {
      const std::string tokens = absl::StrCat(dir_, "/tokens-", name);
      std::ofstream(tokens) << "admin " << kConsoleToken << "\n";
      options.console.listen = "127.0.0.1:0";
      options.console.tokens_file = tokens;
    }
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.state_dir = absl::StrCat(dir_, "/", name);
    options.tls.insecure = true;
    options.store = url_;
    options.store_lease = absl::Seconds(2);
    options.share_tasks = true;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  // An aggregator registering with both coordinators.
  static std::unique_ptr<aggregator::AggregatorServer> StartAggregator(const CoordinatorServer& a,
                                                                       const CoordinatorServer& b) {
    aggregator::AggregatorOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.coordinator = absl::StrCat(a.address(), ",", b.address());
    options.tls.insecure = true;
    absl::StatusOr<std::unique_ptr<aggregator::AggregatorServer>> started =
        aggregator::AggregatorServer::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? *std::move(started) : nullptr;
  }
  // Whether `count` aggregators are registered at `server` within 10 s.
  static bool AggregatorsRegistered(const CoordinatorServer& server, int count) {
    auto control = Control(server);
    return testing::WaitUntil(
        [&] {
          grpc::ClientContext context;
          v1::ListNodesResponse nodes;
          return control->ListNodes(&context, v1::ListNodesRequest(), &nodes).ok() &&
                 nodes.aggregators_size() == count;
        },
        absl::Seconds(10));
  }
  static std::unique_ptr<v1::ControlService::Stub> Control(const CoordinatorServer& server) {
    return v1::ControlService::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  }
  static absl::StatusOr<v1::TaskStatus> Status(v1::ControlService::Stub& control,
                                               const std::string& name) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetTaskStatusRequest request;
    request.set_name(name);
    v1::GetTaskStatusResponse response;
    grpc::Status s = control.GetTaskStatus(&context, request, &response);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
    return response.status();
  }
  static grpc::Status Create(const CoordinatorServer& server, const std::string& name,
                             v1::CreateTaskResponse* response,
                             const std::string& join_token = "token-of-a") {
    grpc::ClientContext context;
    v1::CreateTaskRequest request;
    request.set_task_file(TaskFile(name, join_token));
    return Control(server)->CreateTask(&context, request, response);
  }
  // Opens a session at `server` with a Hello of the peer `name` carrying `join_token`.
  static std::unique_ptr<grpc::ClientReaderWriter<v1::PeerMessage, v1::CoordinatorEvent>> Join(
      const CoordinatorServer& server, const std::string& name, grpc::ClientContext& context,
      const std::string& join_token = "token-of-a") {
    auto session = v1::SessionService::NewStub(
                       grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()))
                       ->Session(&context);
    v1::PeerMessage hello;
    hello.mutable_hello()->set_name(name);
    hello.mutable_hello()->set_shard_count(1);
    hello.mutable_hello()->set_join_token(join_token);
    session->Write(hello);
    return session;
  }

  std::string dir_;
  std::string url_;
};

TEST_F(SharedCoordinatorsTest, CallersAreSentToTheOwnerAndTheOtherTakesOverWhenItGoes) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(a && b);
  // Once each has scanned the other in, a task created at one of them may go to the other.
  auto control_a = Control(*a);
  auto control_b = Control(*b);
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "t", &created).ok());
  EXPECT_EQ(created.status().spec().join_token(), "");
  absl::StatusOr<v1::TaskStatus> at_a;
  absl::StatusOr<v1::TaskStatus> at_b;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        at_a = Status(*control_a, "t");
        at_b = Status(*control_b, "t");
        return at_a.ok() || at_b.ok();
      },
      absl::Seconds(5)))
      << at_a.status() << "; " << at_b.status();
  std::unique_ptr<CoordinatorServer>& owner = at_a.ok() ? a : b;
  std::unique_ptr<CoordinatorServer>& other = at_a.ok() ? b : a;
  auto& control_other = at_a.ok() ? control_b : control_a;

  // The other sends every caller of the task to the owner: status, a second create, a peer
  // with its token.
  absl::StatusOr<v1::TaskStatus> at_other = Status(*control_other, "t");
  EXPECT_EQ(at_other.status().code(), absl::StatusCode::kUnavailable) << at_other.status();
  EXPECT_THAT(at_other.status().message(), HasSubstr("served by coordinator " + owner->address()));
  EXPECT_EQ(Status(*control_other, "none").status().code(), absl::StatusCode::kNotFound);
  v1::CreateTaskResponse again;
  EXPECT_EQ(Create(*other, "t", &again).error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        auto session = Join(*other, "p1", context);
        session->WritesDone();
        v1::CoordinatorEvent event;
        while (session->Read(&event)) {
        }
        grpc::Status s = session->Finish();
        return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
               absl::StrContains(s.error_message(),
                                 "open task is at coordinator " + owner->address());
      },
      absl::Seconds(10)));
  {
    grpc::ClientContext context;
    v1::ListTasksResponse listed;
    ASSERT_TRUE(control_other->ListTasks(&context, v1::ListTasksRequest(), &listed).ok());
    bool listed_t = false;
    for (const v1::TaskStatus& task : listed.tasks()) {
      if (task.spec().name() != "t") continue;
      listed_t = true;
      EXPECT_EQ(task.spec().join_token(), "");
    }
    EXPECT_TRUE(listed_t);
  }

  // The owner stops: it revokes its lease, so the other takes the task over within a scan or
  // two, well before the lease (2 s) would have lapsed.
  owner.reset();
  const absl::Time stopped = absl::Now();
  absl::StatusOr<v1::TaskStatus> taken;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        taken = Status(*control_other, "t");
        return taken.ok();
      },
      absl::Seconds(10)))
      << taken.status();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(2));
  EXPECT_EQ(taken->state(), v1::TASK_STATE_WAITING);
  EXPECT_EQ(taken->spec().rounds(), 3u);
}

// A peer idle at one coordinator is sent to another once an open task there takes it, and an
// aggregator registers with every coordinator.
TEST_F(SharedCoordinatorsTest, IdlePeersMoveToTheOpenTaskAndAggregatorsRegisterWithEach) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(a && b);
  std::unique_ptr<aggregator::AggregatorServer> aggregator = StartAggregator(*a, *b);
  ASSERT_NE(aggregator, nullptr);
  for (CoordinatorServer* coordinator : {a.get(), b.get()}) {
    ASSERT_TRUE(AggregatorsRegistered(*coordinator, 1)) << coordinator->address();
  }

  // No task anywhere yet: each coordinator takes a peer, idle.
  grpc::ClientContext context_a;
  grpc::ClientContext context_b;
  for (grpc::ClientContext* context : {&context_a, &context_b}) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  auto at_a = Join(*a, "idle-a", context_a);
  auto at_b = Join(*b, "idle-b", context_b);
  v1::CoordinatorEvent event;
  ASSERT_TRUE(at_a->Read(&event) && event.has_welcome());
  ASSERT_TRUE(at_b->Read(&event) && event.has_welcome());
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "t", &created).ok());
  const absl::Time time_created = absl::Now();
  // Where it went: a's own, or created for b.
  const bool at_b_now = absl::StrContains(created.status().message(), "for another coordinator");
  auto& owned = at_b_now ? at_b : at_a;
  auto& sent = at_b_now ? at_a : at_b;
  const std::string owner = at_b_now ? b->address() : a->address();
  // The owner assigns its idle peer to the task; the other reads the task within a scan and
  // walks its idle peers once a second: it ends the session, naming the owner.
  ASSERT_TRUE(owned->Read(&event));
  EXPECT_TRUE(event.has_task_assigned()) << event.DebugString();
  while (sent->Read(&event)) {
  }
  grpc::Status ended = sent->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("open task is at coordinator " + owner));
  EXPECT_LT(absl::Now() - time_created, absl::Seconds(5));
  context_a.TryCancel();
  context_b.TryCancel();
  aggregator->Shutdown();
}

// Tasks without join tokens, one at each coordinator, and every peer dialling the first: once
// its own task has the peers it needs and runs, it sends the next peer to the other, whose task
// still waits for peers.
TEST_F(SharedCoordinatorsTest, PeersGoWhereATaskStillWaitsForThem) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(a && b);
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "x", &created, "").ok());
  const bool x_at_b = absl::StrContains(created.status().message(), "for another coordinator");
  ASSERT_TRUE(Create(*a, "y", &created, "").ok());
  // y went where x did not.
  EXPECT_NE(absl::StrContains(created.status().message(), "for another coordinator"), x_at_b);
  CoordinatorServer& x_owner = x_at_b ? *b : *a;
  const std::string y_owner = x_at_b ? a->address() : b->address();
  // A task created for another coordinator is served there once that one has read it from the
  // store, a moment later: until then it sends peers elsewhere.
  auto control = Control(x_owner);
  ASSERT_TRUE(testing::WaitUntil([&] { return Status(*control, "x").ok(); }, absl::Seconds(10)));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::PeerMessage, v1::CoordinatorEvent>>>
      sessions;
  for (const char* name : {"p1", "p2"}) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    sessions.push_back(Join(x_owner, name, *contexts.back(), ""));
    v1::CoordinatorEvent event;
    ASSERT_TRUE(sessions.back()->Read(&event) && event.has_welcome());
    ASSERT_TRUE(sessions.back()->Read(&event));
    EXPECT_TRUE(event.has_task_assigned() && event.task() == "x") << event.DebugString();
    // It holds the initial model (round 0): the task's first round opens once both do.
    v1::PeerMessage held;
    held.set_task("x");
    held.mutable_model_held()->set_round(0);
    ASSERT_TRUE(sessions.back()->Write(held));
  }
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::StatusOr<v1::TaskStatus> x = Status(*control, "x");
        return x.ok() && x->state() == v1::TASK_STATE_RUNNING;
      },
      absl::Seconds(10)));
  // ... and once it has read y, which waits, at its owner (its list shows y as taken).
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        grpc::ClientContext list;
        v1::ListTasksResponse listed;
        if (!control->ListTasks(&list, v1::ListTasksRequest(), &listed).ok()) return false;
        for (const v1::TaskStatus& task : listed.tasks()) {
          if (task.spec().name() == "y") {
            return !absl::StrContains(task.message(), "being taken over");
          }
        }
        return false;
      },
      absl::Seconds(10)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto third = Join(x_owner, "p3", context, "");
  third->WritesDone();
  v1::CoordinatorEvent event;
  while (third->Read(&event)) {
  }
  grpc::Status refused = third->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("open task is at coordinator " + y_owner));
  for (auto& c : contexts) c->TryCancel();
}

// Two aggregators registered with both coordinators, a federated task at each: the second task's
// coordinator counts the aggregator the other's task uses (as stored in etcd) and gives its own
// the other aggregator.
TEST_F(SharedCoordinatorsTest, TasksAtDifferentCoordinatorsGetDifferentAggregators) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(a && b);
  std::vector<std::unique_ptr<aggregator::AggregatorServer>> aggregators;
  for (int i = 0; i < 2; ++i) {
    aggregators.push_back(StartAggregator(*a, *b));
    ASSERT_NE(aggregators.back(), nullptr);
  }
  for (CoordinatorServer* coordinator : {a.get(), b.get()}) {
    ASSERT_TRUE(AggregatorsRegistered(*coordinator, 2)) << coordinator->address();
  }
  // The aggregator of `task` at whichever coordinator serves it ("" while it has none), and
  // whether the other lists it with that aggregator (as it read the task from etcd).
  auto aggregator_of = [&](const std::string& task, bool* listed_elsewhere) {
    std::string aggregator;
    *listed_elsewhere = false;
    for (CoordinatorServer* coordinator : {a.get(), b.get()}) {
      auto control = Control(*coordinator);
      absl::StatusOr<v1::TaskStatus> status = Status(*control, task);
      if (status.ok()) aggregator = status->aggregator();
    }
    for (CoordinatorServer* coordinator : {a.get(), b.get()}) {
      auto control = Control(*coordinator);
      if (Status(*control, task).ok()) continue;
      grpc::ClientContext context;
      v1::ListTasksResponse listed;
      if (!control->ListTasks(&context, v1::ListTasksRequest(), &listed).ok()) continue;
      for (const v1::TaskStatus& other : listed.tasks()) {
        if (other.spec().name() == task && !aggregator.empty() &&
            other.aggregator() == aggregator) {
          *listed_elsewhere = true;
        }
      }
    }
    return aggregator;
  };
  for (const char* task : {"x", "y"}) {
    grpc::ClientContext context;
    v1::CreateTaskRequest request;
    request.set_task_file(TaskFile(task, "", "federated-sync"));
    v1::CreateTaskResponse created;
    ASSERT_TRUE(Control(*a)->CreateTask(&context, request, &created).ok()) << task;
    // Assigned, and read by the other coordinator with its aggregator, before the next.
    bool listed = false;
    ASSERT_TRUE(testing::WaitUntil([&] { return !aggregator_of(task, &listed).empty() && listed; },
                                   absl::Seconds(10)))
        << task;
  }
  bool listed = false;
  const std::string x = aggregator_of("x", &listed);
  const std::string y = aggregator_of("y", &listed);
  EXPECT_NE(x, y) << "both tasks on " << x;
  // Coordinators first: an aggregator that goes before them would be a lost one, its tasks moved.
  a.reset();
  b.reset();
  for (auto& aggregator : aggregators) aggregator->Shutdown();
}

// A coordinator that starts later gets tasks from one that has two more than it: the newest
// waiting task moves, its peer's session and its watch at the first end naming the move, and
// the second serves it.
TEST_F(SharedCoordinatorsTest, ACoordinatorThatStartsLaterGetsATaskFromTheBusiestOne) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  ASSERT_TRUE(a);
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "old", &created, "token-of-old").ok());
  ASSERT_TRUE(Create(*a, "new", &created).ok());
  auto control_a = Control(*a);
  ASSERT_TRUE(Status(*control_a, "old").ok());
  ASSERT_TRUE(Status(*control_a, "new").ok());
  grpc::ClientContext peer_context;
  peer_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto peer = Join(*a, "p1", peer_context);
  v1::CoordinatorEvent event;
  ASSERT_TRUE(peer->Read(&event) && event.has_welcome());
  ASSERT_TRUE(peer->Read(&event));
  ASSERT_TRUE(event.has_task_assigned() && event.task() == "new") << event.DebugString();
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WatchTaskRequest watch_request;
  watch_request.set_name("new");
  auto watch = control_a->WatchTask(&watch_context, watch_request);
  v1::WatchTaskResponse watched;
  ASSERT_TRUE(watch->Read(&watched));

  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(b);
  const absl::Time started = absl::Now();
  auto control_b = Control(*b);
  absl::StatusOr<v1::TaskStatus> moved;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        moved = Status(*control_b, "new");
        return moved.ok();
      },
      absl::Seconds(10)))
      << moved.status();
  // About two seconds of a lasting imbalance (8 scans), then a scan or two.
  EXPECT_LT(absl::Now() - started, absl::Seconds(5));
  EXPECT_EQ(moved->state(), v1::TASK_STATE_WAITING);
  EXPECT_TRUE(Status(*control_a, "old").ok());  // one each now: nothing else moves
  absl::StatusOr<v1::TaskStatus> at_a = Status(*control_a, "new");
  EXPECT_EQ(at_a.status().code(), absl::StatusCode::kUnavailable) << at_a.status();
  EXPECT_THAT(at_a.status().message(), HasSubstr("served by coordinator " + b->address()));

  while (peer->Read(&event)) {
  }
  grpc::Status peer_ended = peer->Finish();
  EXPECT_EQ(peer_ended.error_code(), grpc::StatusCode::UNAVAILABLE) << peer_ended.error_message();
  EXPECT_THAT(peer_ended.error_message(), HasSubstr("moving to another coordinator"));
  while (watch->Read(&watched)) {
    EXPECT_NE(watched.status().state(), v1::TASK_STATE_STOPPED);
  }
  grpc::Status watch_ended = watch->Finish();
  EXPECT_EQ(watch_ended.error_code(), grpc::StatusCode::UNAVAILABLE) << watch_ended.error_message();
  EXPECT_THAT(watch_ended.error_message(), HasSubstr("moving to another coordinator"));
  // The same peer finds the task at its new coordinator.
  grpc::ClientContext again_context;
  again_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto again = Join(*b, "p1", again_context);
  ASSERT_TRUE(again->Read(&event) && event.has_welcome());
  ASSERT_TRUE(again->Read(&event));
  EXPECT_TRUE(event.has_task_assigned() && event.task() == "new") << event.DebugString();
  again_context.TryCancel();
}

// A peer whose task was handed over asks the coordinator that handed it over again first (its
// session was welcomed there): it is sent on to the next coordinator, where its task is, though
// a task there waits for peers it could join (soak: the peers of a decentralized task handed
// over were taken into another task of the coordinator that gave it away, and the task's model,
// which lives in its peers, was lost).
TEST_F(SharedCoordinatorsTest, APeerOfATaskHandedOverFollowsIt) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a");
  ASSERT_TRUE(a);
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "moving", &created).ok());
  grpc::ClientContext context_1;
  grpc::ClientContext context_2;
  for (grpc::ClientContext* context : {&context_1, &context_2}) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  auto p1 = Join(*a, "p1", context_1);
  v1::CoordinatorEvent event;
  ASSERT_TRUE(p1->Read(&event) && event.has_welcome());
  ASSERT_TRUE(p1->Read(&event));
  ASSERT_TRUE(event.has_task_assigned() && event.task() == "moving") << event.DebugString();
  // "staying" takes any peer and waits for three; its peer's data report makes it weigh two, too
  // much to move (a's load 3 above b's 0: only a task of weight 1, "moving", narrows the gap).
  grpc::ClientContext context;
  v1::CreateTaskRequest request;
  request.set_task_file(absl::StrReplaceAll(TaskFile("staying", ""),
                                            {{"min_participants: 2", "min_participants: 3"}}));
  ASSERT_TRUE(Control(*a)->CreateTask(&context, request, &created).ok());
  auto p2 = Join(*a, "p2", context_2, "token-of-no-other-task");
  ASSERT_TRUE(p2->Read(&event) && event.has_welcome());
  ASSERT_TRUE(p2->Read(&event));
  ASSERT_TRUE(event.has_task_assigned() && event.task() == "staying") << event.DebugString();
  v1::PeerMessage report;
  report.set_task("staying");
  report.mutable_data_report()->set_train_samples(10);
  ASSERT_TRUE(p2->Write(report));
  auto control_a = Control(*a);
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return Status(*control_a, "staying").value_or(v1::TaskStatus()).data_size() == 1; },
      absl::Seconds(5)));

  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b");
  ASSERT_TRUE(b);
  while (p1->Read(&event)) {
  }
  grpc::Status ended = p1->Finish();
  ASSERT_THAT(ended.error_message(), HasSubstr("\"moving\" is moving to another coordinator"));
  // It asks a again first, and is sent on rather than taken into "staying"; it goes on asking
  // each coordinator in turn (as a peer does) until b has taken the task over and takes it.
  bool refused_at_a = false;
  bool assigned_at_b = false;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        for (CoordinatorServer* coordinator : {a.get(), b.get()}) {
          grpc::ClientContext again;
          again.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
          auto session = Join(*coordinator, "p1", again);
          if (session->Read(&event) && event.has_welcome() && session->Read(&event)) {
            EXPECT_EQ(coordinator, b.get()) << event.DebugString();
            assigned_at_b = event.has_task_assigned() && event.task() == "moving";
            again.TryCancel();
            return true;
          }
          ended = session->Finish();
          if (coordinator == a.get()) {
            EXPECT_THAT(ended.error_message(), HasSubstr("moved to another coordinator"));
            refused_at_a = true;
          }
        }
        return false;
      },
      absl::Seconds(10)));
  EXPECT_TRUE(refused_at_a);
  EXPECT_TRUE(assigned_at_b) << event.DebugString();
  context_2.TryCancel();
}

// The web console of a coordinator that does not serve a task shows it and stops it, through
// the coordinator that does.
TEST_F(SharedCoordinatorsTest, EitherCoordinatorsConsoleShowsAndStopsATask) {
  std::unique_ptr<CoordinatorServer> a = StartCoordinator("a", /*console=*/true);
  std::unique_ptr<CoordinatorServer> b = StartCoordinator("b", /*console=*/true);
  ASSERT_TRUE(a && b);
  v1::CreateTaskResponse created;
  ASSERT_TRUE(Create(*a, "t", &created).ok());
  CoordinatorServer* owner = nullptr;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        for (CoordinatorServer* c : {a.get(), b.get()}) {
          if (Status(*Control(*c), "t").ok()) owner = c;
        }
        return owner != nullptr;
      },
      absl::Seconds(5)));
  CoordinatorServer& other = owner == a.get() ? *b : *a;
  httplib::Client console(absl::StrCat("http://", other.console()->address()));
  console.set_read_timeout(10, 0);
  const httplib::Headers bearer = {{"Authorization", absl::StrCat("Bearer ", kConsoleToken)}};

  httplib::Result page = console.Get("/api/tasks/t", bearer);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200) << page->body;
  EXPECT_THAT(page->body, HasSubstr("\"name\":\"t\""));
  EXPECT_THAT(page->body, HasSubstr("\"rounds\":[]"));
  httplib::Result missing = console.Get("/api/tasks/none", bearer);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404) << missing->body;
  httplib::Result stopped = console.Post("/api/tasks/t/stop", bearer, "", "text/plain");
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->status, 200) << stopped->body;
  absl::StatusOr<v1::TaskStatus> at_owner = Status(*Control(*owner), "t");
  ASSERT_TRUE(at_owner.ok()) << at_owner.status();
  EXPECT_EQ(at_owner->state(), v1::TASK_STATE_STOPPED);
  // Its event stream, from the owner, starts with the stopped status and ends.
  httplib::Result events = console.Get("/api/tasks/t/events", bearer);
  ASSERT_TRUE(events);
  EXPECT_EQ(events->status, 200);
  EXPECT_THAT(events->body, HasSubstr("TASK_STATE_STOPPED"));
}

}  // namespace
}  // namespace shoal::coordinator
