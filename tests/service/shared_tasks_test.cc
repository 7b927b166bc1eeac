// Coordinators that share their tasks on one etcd prefix (--share-tasks), against a real etcd
// member: first the stores' ownership of tasks (claims, fenced writes, orphans taken by the
// least loaded, a lost lease), then real coordinators (in-process, gRPC on 127.0.0.1:0) that
// send callers of another's task to it and take its tasks over when it goes.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/etcd/etcd_kv.h"
#include "libs/rpc/status.h"
#include "services/aggregator/aggregator_server.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/store/task_ownership.h"
#include "services/coordinator/task_placement.h"
#include "services/coordinator/task_store.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/etcd_suite.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SharedTasksTest : public testing::WithEtcdMember<> {
 protected:
  void SetUp() override {
    ASSERT_NE(etcd(), nullptr);
    absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-shared-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    prefix_ = NewPrefix("shared");
    url_ = absl::StrCat("etcd://", etcd()->endpoint(), prefix_);
  }

  // A store that shares the prefix's tasks as the coordinator at `address`.
  std::unique_ptr<TaskStore> Open(const std::string& address,
                                  std::function<void(const absl::Status&)> on_lost = nullptr) {
    StoreOptions options;
    options.store = url_;
    options.state_dir = dir_;
    options.lease_ttl = absl::Seconds(2);
    options.share_tasks = true;
    options.advertise = address;
    options.on_lost = std::move(on_lost);
    absl::StatusOr<std::unique_ptr<TaskStore>> store = OpenTaskStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    EXPECT_NE((*store)->placement(), nullptr);
    return *std::move(store);
  }

  static TaskOwnership& Ownership(TaskStore& store) {
    return *static_cast<TaskOwnership*>(store.placement());
  }

  static v1::TaskStatus Task(const std::string& name, const std::string& join_token = "") {
    v1::TaskStatus status;
    status.mutable_spec()->set_name(name);
    status.mutable_spec()->set_join_token(join_token);
    status.set_state(v1::TASK_STATE_WAITING);
    return status;
  }

  std::string dir_;
  std::string prefix_;
  std::string url_;
};

TEST_F(SharedTasksTest, TheCreatorOwnsATaskAndOnlyItsWritesLand) {
  std::unique_ptr<TaskStore> a = Open("a:1");
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  // Neither serves a task: the lower address, a, owns the new one.
  EXPECT_TRUE(a->placement()->Claim(Task("t", "secret")).value_or(false));
  EXPECT_TRUE(a->placement()->Claim(Task("t", "secret")).value_or(false));  // a's already
  ASSERT_TRUE(a->PutTask(Task("t", "secret")).ok());
  ASSERT_TRUE(a->PutRound("t", v1::RoundSummary()).ok());

  absl::Status claim = b->placement()->Claim(Task("t")).status();
  EXPECT_EQ(claim.code(), absl::StatusCode::kUnavailable) << claim;
  EXPECT_THAT(claim.message(), HasSubstr("served by coordinator a:1"));
  absl::Status write = b->PutTask(Task("t"));
  EXPECT_EQ(write.code(), absl::StatusCode::kFailedPrecondition) << write;
  EXPECT_EQ(b->DeleteRoundsAfter("t", 0).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_THAT(b->placement()->Elsewhere("t").message(), HasSubstr("served by coordinator a:1"));
  EXPECT_EQ(b->placement()->Elsewhere("nothing").code(), absl::StatusCode::kNotFound);

  // b knows a's open task once it has scanned: listed without its join token, and where a
  // peer with that token goes.
  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(taken->empty());
  std::vector<v1::TaskStatus> others = b->placement()->OthersTasks();
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].spec().name(), "t");
  EXPECT_EQ(others[0].spec().join_token(), "");
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", false).value_or(""), "a:1");
  EXPECT_FALSE(b->placement()->OpenTaskFor("wrong", false).has_value());
  EXPECT_FALSE(a->placement()->OpenTaskFor("secret", false).has_value());  // its own: not elsewhere
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", true).value_or(""), "a:1");  // it waits
  v1::TaskStatus running = Task("t", "secret");
  running.set_state(v1::TASK_STATE_RUNNING);
  ASSERT_TRUE(a->PutTask(running).ok());
  ASSERT_TRUE(Ownership(*b).ScanOnce().ok());
  EXPECT_FALSE(b->placement()->OpenTaskFor("secret", true).has_value());
  EXPECT_EQ(b->placement()->OpenTaskFor("secret", false).value_or(""), "a:1");

  // A new task goes to the coordinator with the fewest open tasks: a, which has one, stores
  // it for b, and b takes it on its next scan.
  absl::StatusOr<bool> placed = a->placement()->Claim(Task("u"));
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_FALSE(*placed);
  EXPECT_EQ(a->PutTask(Task("u")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->placement()->Claim(Task("u")).status().code(), absl::StatusCode::kUnavailable);
  taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("u"));
  EXPECT_TRUE(b->PutTask(Task("u")).ok());
  // Completed tasks are no load: with t done, a is the least loaded again.
  v1::TaskStatus done = Task("t");
  done.set_state(v1::TASK_STATE_COMPLETED);
  ASSERT_TRUE(a->PutTask(done).ok());
  EXPECT_TRUE(a->placement()->Claim(Task("v")).value_or(false));
}

TEST_F(SharedTasksTest, TheTasksOfACoordinatorThatWentAreSharedByTheLeastLoaded) {
  // a alone creates five tasks: all its own.
  std::unique_ptr<TaskStore> a = Open("a:1");
  ASSERT_TRUE(a);
  for (const char* name : {"t1", "t2", "t3", "t4", "t5"}) {
    ASSERT_TRUE(a->placement()->Claim(Task(name)).value_or(false));
    ASSERT_TRUE(a->PutTask(Task(name)).ok());
  }
  std::unique_ptr<TaskStore> b = Open("b:1");
  std::unique_ptr<TaskStore> c = Open("c:1");
  ASSERT_TRUE(b && c);
  a.reset();  // revokes its lease: its owner keys go with it

  // b scans first and takes the orphans that fall to it; c takes the rest on its scan. Each
  // goes to the one with fewer tasks, the lower address among equals: b, c, b, c, b.
  absl::StatusOr<std::vector<std::string>> by_b = Ownership(*b).ScanOnce();
  ASSERT_TRUE(by_b.ok()) << by_b.status();
  absl::StatusOr<std::vector<std::string>> by_c = Ownership(*c).ScanOnce();
  ASSERT_TRUE(by_c.ok()) << by_c.status();
  EXPECT_THAT(*by_b, ElementsAre("t1", "t3", "t5"));
  EXPECT_THAT(*by_c, ElementsAre("t2", "t4"));
  ASSERT_TRUE(b->PutTask(Task("t1")).ok());
  EXPECT_EQ(c->PutTask(Task("t1")).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->PutTask(Task("t2")).ok());
  absl::StatusOr<StoredTask> loaded = b->LoadTask("t3", 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->status.spec().name(), "t3");
  EXPECT_EQ(b->LoadTask("none", 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SharedTasksTest, NewTasksSpreadOverTheCoordinators) {
  std::unique_ptr<TaskStore> a = Open("a:1");
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  // Three tasks created at a in a row, before any scan: the first is a's (the lower address of
  // two without tasks); the second is stored for b (a has one), and counted there; the third
  // is a's again. b's scan takes the second.
  for (const char* name : {"t1", "t2", "t3"}) {
    absl::StatusOr<bool> mine = a->placement()->Claim(Task(name));
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ(*mine, std::string(name) != "t2") << name;
    if (*mine) {
      ASSERT_TRUE(a->PutTask(Task(name)).ok());
    }
  }
  absl::StatusOr<std::vector<std::string>> by_b = Ownership(*b).ScanOnce();
  ASSERT_TRUE(by_b.ok()) << by_b.status();
  EXPECT_THAT(*by_b, ElementsAre("t2"));
  absl::StatusOr<std::vector<std::string>> by_a = Ownership(*a).ScanOnce();
  ASSERT_TRUE(by_a.ok()) << by_a.status();
  EXPECT_TRUE(by_a->empty());
}

TEST_F(SharedTasksTest, ACoordinatorWhoseLeaseLapsedWritesNothingAndItsTasksMove) {
  absl::Mutex mu;
  std::string lost;
  std::unique_ptr<TaskStore> a = Open("a:1", [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    lost = std::string(why.message());
  });
  std::unique_ptr<TaskStore> b = Open("b:1");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->placement()->Claim(Task("t")).value_or(false));
  ASSERT_TRUE(a->PutTask(Task("t")).ok());

  // a's lease goes behind its back (as when it was paused past its TTL).
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({etcd()->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::string key = TaskOwnership::MemberKey(prefix_, "a:1");
  absl::StatusOr<std::vector<etcd::KeyValue>> member = (*kv)->Range({key, key + '\0'});
  ASSERT_TRUE(member.ok() && member->size() == 1u);
  ASSERT_TRUE((*kv)->RevokeLease((*member)[0].lease).ok());

  absl::StatusOr<std::vector<std::string>> taken = Ownership(*b).ScanOnce();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(*taken, ElementsAre("t"));
  absl::Status late = a->PutTask(Task("t"));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  ASSERT_TRUE(b->PutTask(Task("t")).ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return !lost.empty();
      },
      absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_THAT(lost, HasSubstr("lost the hold on"));
}

// --- Real coordinators --------------------------------------------------------------------

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

class SharedCoordinatorsTest : public SharedTasksTest {
 protected:
  std::unique_ptr<CoordinatorServer> StartCoordinator(const std::string& name) {
    CoordinatorServerOptions options;
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
  auto control = Control(x_owner);
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

}  // namespace
}  // namespace shoal::coordinator
