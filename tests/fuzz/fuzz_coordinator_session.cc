// The coordinator's core fed peer sessions from the input: Hello and PeerMessage messages parsed
// from bytes (their `task` pointed at the real task when the input says so) arrive on behalf of
// up to four peers, among disconnects, driver steps, clock jumps, the aggregator's answers and
// watch events (accepted updates, published versions, a lost aggregator) and operator calls,
// for a task of any mode; the aggregator work runs on manual executors. The task store is the real
// SQLite store, emptied before each input so that every run starts from the same state.

#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <prometheus/registry.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/task/task_file.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "tests/fakes/manual_executor.h"
#include "tests/fakes/scripted_aggregator.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_log.h"
#include "tests/testing/fake_clock.h"

namespace shoal::coordinator {
namespace {

using shoal::testing::FakeClock;

constexpr char kTask[] = "t";

class NullSink final : public PeerSink {
 public:
  void Send(const v1::CoordinatorEvent& event) override { ++events; }
  void Close(const absl::Status& status) override { closed = true; }
  int events = 0;
  bool closed = false;
};

// One state directory per process, on tmpfs when there is one; emptied before every input.
class Store {
 public:
  Store() {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/shoal-fuzz-coordinator-XXXXXX";
    SHOAL_FUZZ_CHECK(mkdtemp(templ.data()) != nullptr);
    dir_ = templ;
    store_ = *SqliteTaskStore::Open(dir_);
    SHOAL_FUZZ_CHECK(sqlite3_open((dir_ + "/coordinator.db").c_str(), &db_) == SQLITE_OK);
  }
  TaskStore& Empty() {
    for (const char* table : {"tasks", "rounds", "checkpoints"}) {
      const std::string sql = std::string("DELETE FROM ") + table + ";";
      SHOAL_FUZZ_CHECK(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    }
    return *store_;
  }

 private:
  std::string dir_;
  std::unique_ptr<TaskStore> store_;
  sqlite3* db_ = nullptr;
};

common::v1::TaskSpec Spec(FuzzedDataProvider& in) {
  common::v1::TaskSpec spec = task::DefaultTaskSpec();
  spec.set_name(kTask);
  const common::v1::Mode modes[] = {common::v1::MODE_FEDERATED_SYNC, common::v1::MODE_DECENTRALIZED,
                                    common::v1::MODE_GOSSIP, common::v1::MODE_FEDERATED_ASYNC};
  spec.set_mode(modes[in.ConsumeIntegralInRange(0, 3)]);
  spec.set_rounds(in.ConsumeIntegralInRange(1, 3));
  spec.set_min_participants(in.ConsumeIntegralInRange(1, 3));
  spec.set_round_deadline_seconds(in.ConsumeIntegralInRange(1, 60));
  if (spec.mode() == common::v1::MODE_FEDERATED_SYNC && in.ConsumeBool()) {
    // A tree: clusters of 1-2 peers on the five registered aggregators, maybe three deep, maybe
    // with a backup each (replicas; any of them lost, primary or backup).
    spec.set_topology(common::v1::TOPOLOGY_HIERARCHICAL);
    spec.set_cluster_size(in.ConsumeIntegralInRange(2, 3));
    spec.set_fanout(2);
    spec.set_replicas(in.ConsumeIntegralInRange(1, 2));
  }
  task::ApplyTaskDefaults(spec);
  return spec;
}

std::string PeerName(FuzzedDataProvider& in) {
  static const char* kNames[] = {"a", "b", "c", "d"};
  if (in.ConsumeProbability<float>() < 0.05f) return in.ConsumeRandomLengthString(8);
  return kNames[in.ConsumeIntegralInRange(0, 3)];
}

// Points the message at the real task.
void AimAtTask(v1::PeerMessage& message) { message.set_task(kTask); }

void Run(FuzzedDataProvider& in) {
  static Store* store = new Store();
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  FakeClock clock;
  fakes::ScriptedAggregator aggregator;
  aggregator.contributors = {"a", "b"};
  fakes::ManualExecutor calls, transfers, writes;
  auto run_work = [&] {
    while (calls.RunAll() + transfers.RunAll() + writes.RunAll() > 0) {
    }
  };
  CoordinatorOptions options;
  auto made =
      CoordinatorCore::Create(options, store->Empty(), aggregator,
                              CoordinatorExecutors{calls, transfers, writes}, clock, metrics);
  SHOAL_FUZZ_CHECK(made.ok());
  std::unique_ptr<CoordinatorCore> owned = *std::move(made);
  CoordinatorCore& core = *owned;
  SHOAL_FUZZ_CHECK(core.RegisterAggregator("127.0.0.1:5555").ok());
  const common::v1::TaskSpec spec = Spec(in);
  if (spec.topology() == common::v1::TOPOLOGY_HIERARCHICAL) {
    SHOAL_FUZZ_CHECK(core.RegisterAggregator("127.0.0.1:5556", {}, "aggregator-1").ok());
    SHOAL_FUZZ_CHECK(core.RegisterAggregator("127.0.0.1:5557", {}, "aggregator-2").ok());
    SHOAL_FUZZ_CHECK(core.RegisterAggregator("127.0.0.1:5558", {}, "aggregator-3").ok());
    SHOAL_FUZZ_CHECK(core.RegisterAggregator("127.0.0.1:5559", {}, "aggregator-4").ok());
  }
  SHOAL_FUZZ_CHECK(core.CreateTask(spec).ok());

  struct Session {
    std::string id;
    std::shared_ptr<NullSink> sink;
  };
  std::vector<Session> sessions;
  const int steps = in.ConsumeIntegralInRange(1, 64);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange(0, 7)) {
      case 0: {
        v1::Hello hello;
        if (in.ConsumeBool()) {
          hello.set_name(PeerName(in));
          hello.set_shard_count(in.ConsumeIntegralInRange(0, 4));
          hello.set_shard_index(in.ConsumeIntegralInRange(0, 4));
          hello.set_listen_address("127.0.0.1:" + std::to_string(in.ConsumeIntegralInRange(0, 9)));
          // Offers to host a supernode, with some compute: may be elected.
          hello.set_supernode(in.ConsumeBool());
          hello.mutable_capacity()->set_cpu_cores(in.ConsumeIntegralInRange(0, 4));
          hello.mutable_capacity()->set_matmul_gflops(in.ConsumeIntegralInRange(0, 40));
        } else if (!hello.ParseFromString(in.ConsumeRandomLengthString(96))) {
          break;
        }
        auto sink = std::make_shared<NullSink>();
        absl::StatusOr<std::string> id = core.Connect(hello, in.ConsumeBool() ? "" : "a", sink);
        if (id.ok()) sessions.push_back({*id, sink});
        break;
      }
      case 1:
      case 2: {
        v1::PeerMessage message;
        if (!message.ParseFromString(in.ConsumeRandomLengthString(128))) break;
        if (in.ConsumeBool()) AimAtTask(message);
        const std::string peer =
            sessions.empty() || in.ConsumeProbability<float>() < 0.05f
                ? PeerName(in)
                : sessions[in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1)].id;
        (void)core.OnMessage(peer, message);
        break;
      }
      case 3:
        if (!sessions.empty()) {
          const size_t i = in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1);
          core.Disconnect(sessions[i].id, sessions[i].sink.get());
          sessions.erase(sessions.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      case 4:
        core.Step();
        run_work();
        break;
      case 5:
        clock.Advance(absl::Seconds(in.ConsumeIntegralInRange(0, 120)));
        core.Step();
        run_work();
        break;
      case 6: {
        // The aggregator: its answers, its watch stream (accepted updates, published versions),
        // losing it.
        const absl::Status fail =
            in.ConsumeBool() ? absl::UnavailableError("down") : absl::InternalError("broken");
        switch (in.ConsumeIntegralInRange(0, 5)) {
          case 0:
            aggregator.open_status = in.ConsumeBool() ? absl::OkStatus() : fail;
            break;
          case 1:
            aggregator.close_status = in.ConsumeBool() ? absl::OkStatus() : fail;
            break;
          case 2:
            aggregator.Accept(kTask, in.ConsumeIntegralInRange(0, 4), PeerName(in));
            break;
          case 3:
            aggregator.Publish(kTask, in.ConsumeIntegralInRange(0, 4), {PeerName(in)});
            break;
          case 4:
            aggregator.BreakWatches(
                absl::StrCat("127.0.0.1:", 5555 + in.ConsumeIntegralInRange(0, 8)), fail);
            break;
          default:
            run_work();
        }
        break;
      }
      default:
        switch (in.ConsumeIntegralInRange(0, 5)) {
          case 0:
            (void)core.StopTask(kTask);
            break;
          case 4: {
            // A peer's (elected or not) aggregator registers, naming it as host.
            const std::string host =
                sessions.empty() || in.ConsumeBool()
                    ? PeerName(in)
                    : sessions[in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1)].id;
            common::v1::Capacity capacity;
            capacity.set_cpu_cores(in.ConsumeIntegralInRange(0, 4));
            capacity.set_matmul_gflops(in.ConsumeIntegralInRange(0, 40));
            (void)core.RegisterAggregator(
                absl::StrCat("127.0.0.1:", 5560 + in.ConsumeIntegralInRange(0, 3)), capacity, "",
                host);
            break;
          }
          case 5:
            (void)core.ListNodes();
            break;
          case 1:
            (void)core.ListTasks();
            break;
          case 2:
            (void)core.CheckTaskExists(kTask);
            break;
          default:
            (void)core.RegisterAggregator(in.ConsumeRandomLengthString(24));
        }
    }
    SHOAL_FUZZ_CHECK(core.GetTaskStatus(kTask).ok());
  }
  for (const Session& s : sessions) core.Disconnect(s.id, s.sink.get());
  core.Step();
  run_work();
  owned.reset();  // the core's queues are empty: nothing runs after it
  run_work();
}

}  // namespace
}  // namespace shoal::coordinator

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::LogOnlyWhenReplaying(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  shoal::coordinator::Run(in);
  return 0;
}
