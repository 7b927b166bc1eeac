#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/address_list.h"
#include "libs/tensor/flat_model.h"
#include "shoal/common/v1/model.pb.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace shoal::shoalctl {

// Lets another thread end a blocking call (a watch, a download) early; the call then returns
// CANCELLED. Once cancelled it stays cancelled. Thread-safe; owned by the caller and must
// outlive the calls it is passed to.
class Canceller {
 public:
  void Cancel();
  bool cancelled() const;

  // For client implementations: `on_cancel` runs now if already cancelled, else on Cancel(),
  // until Detach(), which waits for a run in progress. Returns false if already cancelled
  // (on_cancel has then run).
  bool Attach(std::function<void()> on_cancel);
  void Detach();

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // on_cancel_ is being run by Cancel()
};

// A global model downloaded from the coordinator.
struct DownloadedModel {
  common::v1::ModelMeta meta;
  tensor::FlatModel model;
};

// One page of a task's stored round history (ControlService.ListRounds).
struct RoundsPage {
  // Oldest first.
  std::vector<coordinator::v1::RoundSummary> rounds;
  // Rounds after the last one in `rounds` exist.
  bool more = false;
};

// Client of the coordinator's ControlService, as an interface so the command code can be tested
// with a fake. Every method takes the call's deadline; errors carry the gRPC code.
class ControlClientInterface {
 public:
  virtual ~ControlClientInterface() = default;

  virtual absl::StatusOr<coordinator::v1::TaskStatus> CreateTask(const common::v1::TaskSpec& spec,
                                                                 absl::Duration timeout) = 0;
  virtual absl::StatusOr<std::vector<coordinator::v1::TaskStatus>> ListTasks(
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<coordinator::v1::TaskStatus> GetTaskStatus(const std::string& name,
                                                                    absl::Duration timeout) = 0;
  virtual absl::StatusOr<coordinator::v1::TaskStatus> StopTask(const std::string& name,
                                                               absl::Duration timeout) = 0;
  // Deletes an ended task with its rounds and checkpoints. Errors: NOT_FOUND unknown task,
  // FAILED_PRECONDITION a task still open.
  virtual absl::Status DeleteTask(const std::string& name, absl::Duration timeout) = 0;
  // Calls `on_status` with every status the coordinator streams, until the stream ends (the
  // task ended), `on_status` returns false, `canceller` fires (CANCELLED) or `timeout` passes
  // (DEADLINE_EXCEEDED). Returns the last status received; NOT_FOUND / UNAVAILABLE as usual.
  // An UNAVAILABLE after some statuses were received means the stream broke mid-way.
  virtual absl::StatusOr<coordinator::v1::TaskStatus> WatchTask(
      const std::string& name, absl::Duration timeout,
      const std::function<bool(const coordinator::v1::TaskStatus&)>& on_status,
      Canceller* canceller) = 0;
  // Up to `limit` (1..1000) of the task's stored rounds after round `after_round` (0: from the
  // first), in order. The coordinator keeps only the newest rounds in TaskStatus.history; this
  // pages through all of them. Errors: NOT_FOUND unknown task, INVALID_ARGUMENT limit over 1000.
  virtual absl::StatusOr<RoundsPage> ListRounds(const std::string& name, uint64_t after_round,
                                                uint32_t limit, absl::Duration timeout) = 0;
  // The connected peers and registered aggregators, with their capacity.
  virtual absl::StatusOr<coordinator::v1::ListNodesResponse> ListNodes(absl::Duration timeout) = 0;
  // Downloads the task's latest checkpointed model, or exactly `version`.
  virtual absl::StatusOr<DownloadedModel> GetModel(const std::string& name,
                                                   std::optional<uint64_t> version,
                                                   absl::Duration timeout,
                                                   Canceller* canceller) = 0;
  // The same straight into the model file `path` (tensor::ModelFileWriter: the values go to a
  // temporary file beside it as they arrive, and it becomes `path` once the stream is complete
  // and every tensor's digest checked), without a buffer the size of the model. The model
  // returned has the layout and no values. A download that fails leaves no file and `path` as
  // it was. Errors besides GetModel's: those of writing the file, naming it.
  virtual absl::StatusOr<DownloadedModel> GetModelFile(const std::string& name,
                                                       std::optional<uint64_t> version,
                                                       const std::string& path,
                                                       absl::Duration timeout,
                                                       Canceller* canceller) = 0;
};

// ControlClientInterface over a gRPC channel. Thread-safe (calls may run concurrently).
class ControlClient final : public ControlClientInterface {
 public:
  // `address` is HOST:PORT, or HOST:PORT,HOST:PORT,... for an active coordinator and its
  // standbys: each call goes to the one that serves (rpc::CallAny, moving on from an address
  // that answers UNAVAILABLE within the call's timeout). The channels connect lazily, so this
  // does not fail for an unreachable coordinator (the calls do, with UNAVAILABLE).
  static absl::StatusOr<std::unique_ptr<ControlClient>> Create(
      const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials);
  ~ControlClient() override;

  const std::string& address() const { return address_; }

  absl::StatusOr<coordinator::v1::TaskStatus> CreateTask(const common::v1::TaskSpec& spec,
                                                         absl::Duration timeout) override;
  absl::StatusOr<std::vector<coordinator::v1::TaskStatus>> ListTasks(
      absl::Duration timeout) override;
  absl::StatusOr<coordinator::v1::TaskStatus> GetTaskStatus(const std::string& name,
                                                            absl::Duration timeout) override;
  absl::StatusOr<coordinator::v1::TaskStatus> StopTask(const std::string& name,
                                                       absl::Duration timeout) override;
  absl::Status DeleteTask(const std::string& name, absl::Duration timeout) override;
  absl::StatusOr<coordinator::v1::TaskStatus> WatchTask(
      const std::string& name, absl::Duration timeout,
      const std::function<bool(const coordinator::v1::TaskStatus&)>& on_status,
      Canceller* canceller) override;
  absl::StatusOr<RoundsPage> ListRounds(const std::string& name, uint64_t after_round,
                                        uint32_t limit, absl::Duration timeout) override;
  absl::StatusOr<coordinator::v1::ListNodesResponse> ListNodes(absl::Duration timeout) override;
  absl::StatusOr<DownloadedModel> GetModel(const std::string& name, std::optional<uint64_t> version,
                                           absl::Duration timeout, Canceller* canceller) override;
  absl::StatusOr<DownloadedModel> GetModelFile(const std::string& name,
                                               std::optional<uint64_t> version,
                                               const std::string& path, absl::Duration timeout,
                                               Canceller* canceller) override;

 private:
  explicit ControlClient(std::unique_ptr<rpc::AddressList> coordinators);
  // One attempt of GetModel at `target`, the values into `write` when given.
  static absl::StatusOr<DownloadedModel> ReadModel(const rpc::AddressList::Target& target,
                                                   absl::Time deadline,
                                                   const coordinator::v1::GetModelRequest& request,
                                                   Canceller* canceller, tensor::WriteValues write);

  const std::unique_ptr<rpc::AddressList> coordinators_;
  const std::string address_;
};

}  // namespace shoal::shoalctl
