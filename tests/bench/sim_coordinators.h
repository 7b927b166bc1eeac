#pragma once

// shoal-sim's coordinators: one shoal-coordinator process on SQLite, the same hosted in
// shoal-sim's own process (in-process channel, or direct calls to its core), or several that
// share their tasks on one etcd member (--share-tasks), each task served by one of them.
// Creates, reads and stops tasks wherever they are served, points a fleet's sessions at a
// task's coordinator, and reads the coordinators' CPU, memory and metrics.

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/coordinator_server.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/bench/light_peer.h"

namespace shoal::testing {
class EtcdMember;
}

namespace shoal::bench {

// A service process started for a benchmark: its gRPC and metrics addresses (from its
// --address-file), its log beside it in the benchmark's directory.
struct SimService {
  std::unique_ptr<process::Process> process;
  std::string address;  // gRPC HOST:PORT
  std::string metrics;  // HOST:PORT of its /metrics
};

// Starts `binary` of `bin_dir` as `name` (plaintext, ports chosen by the kernel), its log and
// address file in `dir`, and waits for its addresses (30 s).
absl::StatusOr<SimService> StartSimService(const std::string& dir, const std::string& bin_dir,
                                           const std::string& name, const std::string& binary,
                                           std::vector<std::string> args);

// How the simulated peers reach their coordinator.
enum class CoordinatorTransport {
  kTcp,        // shoal-coordinator processes, a TCP connection per session
  kInProcess,  // hosted in this process, every session a stream of its in-process channel
  kDirect,     // hosted in this process, sessions calling its core (no gRPC between them)
};

struct SimCoordinatorOptions {
  int count = 1;
  // The store: one etcd member (started here) with every coordinator sharing its tasks on it;
  // required when count > 1. Otherwise SQLite in the coordinator's state directory.
  bool etcd = false;
  CoordinatorTransport transport = CoordinatorTransport::kTcp;
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration store_lease = absl::Seconds(10);  // with etcd: --store-lease
  std::string dir;                                 // state, logs and etcd's data
  std::string bin_dir;                             // where shoal-coordinator is
};

class SimCoordinators {
 public:
  // INVALID_ARGUMENT for several coordinators without etcd; FAILED_PRECONDITION for etcd in a
  // build without the etcd store; a start's error otherwise (its log's end in the message).
  static absl::StatusOr<std::unique_ptr<SimCoordinators>> Start(SimCoordinatorOptions options);
  ~SimCoordinators();

  int size() const { return static_cast<int>(addresses_.size()); }
  bool hosted() const { return !hosted_.empty(); }  // in this process
  // Every coordinator's address, comma separated (an aggregator's --coordinator).
  std::string Addresses() const;
  // Creates the task through the first coordinator, waits until one of them serves it (with
  // shared tasks the least loaded one takes it) and returns that one's index.
  absl::StatusOr<int> CreateTask(const common::v1::TaskSpec& spec);
  // The task's status from the coordinator that serves it.
  absl::StatusOr<coordinator::v1::TaskStatus> TaskStatus(const std::string& name);
  void StopTask(const std::string& name);
  // Points a fleet at coordinator `i`: its address, and with a hosted coordinator its
  // in-process channel or its core.
  void Connect(int i, Fleet::Options& options) const;

  // A counter or gauge summed over the coordinators' metrics pages; -1 when one cannot be read.
  double Metric(const std::string& metric) const;
  // The coordinators' CPU seconds and resident memory, summed over their processes (this
  // process's when they are hosted here: the peers' then included).
  double CpuSeconds() const;
  double RssMiB() const;
  // The etcd member's CPU seconds; 0 without etcd.
  double EtcdCpuSeconds() const;
  // OK while every coordinator process runs; otherwise names one that exited, with its log's
  // end.
  absl::Status CheckRunning() const;
  // Stops the coordinators, then etcd. Idempotent.
  void Stop();

 private:
  explicit SimCoordinators(SimCoordinatorOptions options);
  absl::Status StartEtcd();
  absl::Status StartOne(int i);
  absl::StatusOr<int> IndexOf(const std::string& address) const;
  // The client of the coordinator that serves `task` (the first one's before it is placed).
  coordinator::v1::ControlService::Stub& ControlFor(const std::string& task) const;

  const SimCoordinatorOptions options_;
  std::string store_ = "sqlite";
  // shared_ptr: its deleter is bound where it is made, so a build without etcd never needs the
  // type.
  std::shared_ptr<testing::EtcdMember> etcd_;
  std::vector<SimService> processes_;  // kTcp
  // Hosted coordinators that lost their etcd lease (their callback counts here: declared before
  // them, so it outlives them).
  std::atomic<int> stores_lost_{0};
  std::vector<std::unique_ptr<coordinator::CoordinatorServer>> hosted_;
  std::vector<std::string> addresses_;
  std::vector<std::string> metrics_;
  std::vector<std::unique_ptr<coordinator::v1::ControlService::Stub>> control_;
  std::map<std::string, int> served_by_;  // task -> coordinator index
  bool stopped_ = false;
};

}  // namespace shoal::bench
