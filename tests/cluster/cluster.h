#pragma once

// A local Shoal cluster of real processes on 127.0.0.1 for cluster tests: one coordinator, one or
// more aggregators, N peers, each started on port 0 and found through its --address-file.

#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/reserved_port.h"

namespace shoal::testing {

struct Service {
  std::unique_ptr<process::Process> process;
  std::string address;
  std::string metrics_address;
};

// Owns the processes; the destructor stops them (peers first) and records a test failure
// (ADD_FAILURE) for a service that does not exit cleanly on SIGTERM, and for any sanitizer
// report in a service's log. Not thread-safe.
class Cluster {
 public:
  // `dir` is a fresh temp directory for logs, address files and state.
  explicit Cluster(std::string dir);
  ~Cluster();

  // `extra_args` are appended to the coordinator's command line (also on restarts), e.g.
  // "--heartbeat-interval=3s".
  absl::Status StartCoordinator(std::vector<std::string> extra_args = {});
  // Stops the coordinator (SIGKILL when `crash`, else SIGTERM) and starts a new one on the same
  // gRPC address and state directory, as a restarted pod would be.
  absl::Status RestartCoordinator(bool crash);
  // One more coordinator with the same arguments and state directory ("coordinator-standby",
  // then "coordinator-standby-2", ...): with --store etcd://, a standby of the active one.
  // Aggregators and peers started afterwards are given every address (CoordinatorAddresses).
  absl::Status StartStandbyCoordinator();
  // SIGKILLs the coordinator, waits until one of the standbys serves (ListTasks answers), and
  // makes it the coordinator (the tests' calls go to it); the killed one takes its place among
  // the standbys, stopped. Returns the time from the kill to serving.
  absl::StatusOr<absl::Duration> KillCoordinatorForStandby(absl::Duration timeout);
  // Starts the stopped standby `index` again on its address and state directory, as a
  // restarted pod would be: a killed coordinator comes back as a standby.
  absl::Status RestartStandby(int index);
  // How many times the coordinator exited on its own (it lost its hold on the etcd store and
  // stepped down) and the cluster made the standby serving in its place the coordinator.
  int step_downs_followed() const { return step_downs_followed_; }
  // Waits until the coordinator answers ListTasks (a standby does not).
  absl::Status WaitForCoordinatorServing(absl::Duration timeout);
  // --coordinator for aggregators and peers: the coordinator's address, then the standbys'.
  std::string CoordinatorAddresses() const;
  // Starts one more aggregator (aggregator(0), aggregator(1), ...).
  absl::Status StartAggregator();
  absl::Status StartPeer(int index, int count, std::vector<std::string> extra_args = {});
  // Peers `first` .. `first` + `n` - 1 of `count`, as StartPeer (each with `extra_args`, in
  // which "{index}" stands for the peer's index), started together: the next one is launched
  // before the last one listens, so their start-ups overlap.
  absl::Status StartPeers(int first, int n, int count, std::vector<std::string> extra_args = {});
  // The same with the peer's test build, shoal-peer-testing (tests/peer_testing/), whose
  // `extra_args` may add --test-byzantine and --test-slow-batch.
  absl::Status StartTestPeer(int index, int count, std::vector<std::string> extra_args);
  // A peer whose data is its own: --data-dir `data_dir`, no --shard.
  absl::Status StartOwnDataPeer(int index, const std::string& data_dir,
                                std::vector<std::string> extra_args = {});

  // Every production peer started after this (StartPeer, StartPeers, StartPeerInNetns) runs the
  // peer's test build with --test-slow-batch=`ms` instead: each training batch is followed by a
  // pause of `ms`, so a round of B batches takes at least B x `ms` however fast the machine trains.
  // For tests that act while a round or a task runs (kill or pause a service, start a late joiner):
  // with OpenBLAS a round of the MLP's 20 batches takes about 50 ms, less than one status poll. 0:
  // off.
  void set_batch_floor_ms(int ms) { batch_floor_ms_ = ms; }

  // The address every service listens on (default 127.0.0.1), also named in the certificates
  // issued after it is set. For tests that run the cluster in a network namespace of their own.
  void set_host(std::string host) { host_ = std::move(host); }
  // A peer run in the network namespace `netns` (ip netns exec), listening on that namespace's
  // 127.0.0.1, so that nothing outside it can connect to the peer; "": StartPeer.
  absl::Status StartPeerInNetns(int index, int count, const std::string& netns,
                                std::vector<std::string> extra_args = {});

  // Mutual-TLS directory for clients of this cluster (the tests' own calls).
  std::string ClientTlsDir() const { return dir_ + "/certs/client"; }
  std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() const { return credentials_; }

  Service& coordinator() { return coordinator_; }
  Service& standby(int index = 0) { return standbys_.at(index); }
  int standby_count() const { return static_cast<int>(standbys_.size()); }
  Service& aggregator(int index = 0) { return aggregators_.at(index); }
  int aggregator_count() const { return static_cast<int>(aggregators_.size()); }
  Service& peer(int index) { return peers_.at(index); }
  coordinator::v1::ControlService::Stub& control() { return *control_; }
  const std::string& dir() const { return dir_; }

  // ControlService.CreateTask with a 10 s deadline.
  absl::Status CreateTask(const common::v1::TaskSpec& spec);
  absl::StatusOr<coordinator::v1::TaskStatus> Status(const std::string& task);
  // ControlService.ListNodes: the connected peers and registered aggregators.
  absl::StatusOr<coordinator::v1::ListNodesResponse> Nodes();
  // Polls the task's status until `pred` holds; fails after `timeout` (scaled for a sanitized
  // build: testing::Scaled, as every wait of this class), or at once FAILED_PRECONDITION when
  // the task ended first, with the last status and the tails of the service logs.
  absl::StatusOr<coordinator::v1::TaskStatus> WaitFor(
      const std::string& task, const std::function<bool(const coordinator::v1::TaskStatus&)>& pred,
      absl::Duration timeout, const std::string& what);
  // WaitFor the task of `spec` to end (no longer running nor waiting), within TaskBound(spec).
  absl::StatusOr<coordinator::v1::TaskStatus> WaitForEnd(const common::v1::TaskSpec& spec);
  std::string LogTails();
  // Waits until the coordinator's peers_connected gauge reads `count`.
  absl::Status WaitForPeersConnected(int count, absl::Duration timeout);
  // The longest `spec` can take by its own bounds (every round closes by its deadline), with a
  // minute for the peers to start: for waiting on the end of a task.
  static absl::Duration TaskBound(const common::v1::TaskSpec& spec);

  // Issues NAME's certificate under DIR/certs with shoal-gen-certs (the cluster's CA): DIR/certs/
  // NAME holds ca.crt, tls.crt and tls.key.
  absl::Status MakeCertificate(const std::string& name);

 private:
  // ADD_FAILURE for each sanitizer report (ASan, LSan, UBSan, TSan) in the logs of `dir_`.
  void ExpectNoSanitizerReports();
  // Every thread's stack of `p` (by gdb, into `dir_`/NAME.stacks.txt), for a failure message.
  std::string DumpStacks(process::Process& p);
  // Listens on `listen` (default host_:0); in the network namespace `netns` when set; with the
  // certificate of `identity` (default: `name`).
  absl::StatusOr<Service> Start(const std::string& name, const std::string& binary,
                                std::vector<std::string> args, std::string listen = "",
                                const std::string& netns = "", std::string identity = "");
  // Start in two steps: Launch starts the process, WaitForAddresses waits for its address file.
  struct Launched {
    std::unique_ptr<process::Process> process;
    std::string address_file;
  };
  absl::StatusOr<Launched> Launch(const std::string& name, const std::string& binary,
                                  std::vector<std::string> args, std::string listen = "",
                                  const std::string& netns = "", std::string identity = "");
  absl::StatusOr<Service> WaitForAddresses(Launched launched);
  // A shared-data peer's command line: `extra_args`, then --coordinator, --data-dir, --shard
  // and --name.
  std::vector<std::string> SharedDataPeerArgs(int index, int count,
                                              std::vector<std::string> extra_args) const;
  absl::Status StartCoordinatorOn(const std::string& listen);
  // Starts a coordinator that waits as a standby (its certificate is the coordinator's: the
  // aggregators take the coordinator's calls from that name only).
  absl::StatusOr<Service> StartStandbyOn(const std::string& name, const std::string& listen);
  // Makes standby `index` the coordinator (the tests' calls go to it) once the coordinator has
  // exited; the old one takes its place among the standbys, its port held until RestartStandby.
  absl::Status PromoteStandby(int index);
  // With standbys, when the coordinator has exited though no test stopped it (it stepped down)
  // and a standby serves, PromoteStandby: CreateTask, Status and Nodes follow a stepped-down
  // coordinator's successor, as peers and aggregators given every address do. One probe.
  void FollowStepDown();
  // One probe (ListTasks) of each running standby: the index of the first that serves, else
  // nullopt and, in `last` when given, the last refusal.
  std::optional<int> ServingStandby(std::string* last);
  // Polls the standbys until one serves; returns its index.
  absl::StatusOr<int> WaitForServingStandby(absl::Duration timeout);
  // The coordinator's command line but --listen and the files Start adds.
  std::vector<std::string> CoordinatorArgs() const;
  // `binary` and `extra_args` with the batch floor applied: the test build and its
  // --test-slow-batch for the production peer while set_batch_floor_ms holds a floor.
  std::pair<std::string, std::vector<std::string>> Paced(std::string binary,
                                                         std::vector<std::string> extra_args) const;
  // Peer `index` of `count` (shard index/count, id peer-INDEX) run from `binary`.
  absl::Status StartSharedDataPeer(const std::string& binary, int index, int count,
                                   const std::string& netns, std::vector<std::string> extra_args);

  std::string dir_;
  std::string bin_dir_;
  std::string host_ = "127.0.0.1";
  int batch_floor_ms_ = 0;
  int step_downs_followed_ = 0;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  Service coordinator_;
  // StartStandbyCoordinator; a killed coordinator after KillCoordinatorForStandby, its port held
  // (by address) until RestartStandby.
  std::vector<Service> standbys_;
  std::map<std::string, ReservedPort> held_ports_;
  std::vector<std::string> coordinator_args_;
  std::vector<Service> aggregators_;
  std::map<int, Service> peers_;
  std::unique_ptr<coordinator::v1::ControlService::Stub> control_;
};

// A small fast task: MLP on a slice of Fashion-MNIST.
common::v1::TaskSpec SmallTask(const std::string& name);

}  // namespace shoal::testing
