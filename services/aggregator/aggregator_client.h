#pragma once

#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/tensor/flat_model.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/model.pb.h"

namespace shoal::aggregator {

// Client of AggregatorService, used by peers (models and deltas) and by the coordinator (rounds,
// checkpoints). One attempt per call, bounded by `deadline`; retrying is the caller's business
// (the channel itself retries UNAVAILABLE). Errors name the call and the aggregator.
// Implementations are thread-safe.
// Who a peer-data call is made for: the peer's id and session token (both empty for the
// coordinator's own calls).
struct Caller {
  std::string peer_id;
  std::string session_token;
};

class AggregatorClient {
 public:
  virtual ~AggregatorClient() = default;

  // Uploads a whole model (AggregatorService.PutModel). Returns the aggregator's digest. The
  // model is shared because the transport sends straight from its memory.
  virtual absl::StatusOr<uint64_t> PutModel(const std::string& address,
                                            const common::v1::ModelMeta& meta,
                                            std::shared_ptr<const tensor::FlatModel> model,
                                            const Caller& caller, absl::Time deadline) = 0;
  // Pushes a delta (AggregatorService.PushUpdate). Returns `duplicate`.
  virtual absl::StatusOr<bool> PushUpdate(const std::string& address, const v1::UpdateMeta& meta,
                                          std::shared_ptr<const tensor::FlatModel> delta,
                                          absl::Time deadline) = 0;
  // Downloads model `version` of `task` (AggregatorService.GetModel).
  virtual absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address,
                                                     const std::string& task, uint64_t version,
                                                     const Caller& caller, absl::Time deadline) = 0;
  // Replaces the task's members and their session tokens (the coordinator's call).
  virtual absl::Status SetMembers(const std::string& address, const v1::SetMembersRequest& request,
                                  absl::Time deadline) = 0;
  virtual absl::Status OpenRound(const std::string& address, const v1::OpenRoundRequest& request,
                                 absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::CloseRoundResponse> CloseRound(const std::string& address,
                                                            const v1::CloseRoundRequest& request,
                                                            absl::Time deadline) = 0;
  virtual absl::Status ReleaseTask(const std::string& address, const std::string& task,
                                   absl::Time deadline) = 0;
};

// AggregatorClient over gRPC; keeps one channel per aggregator address. Thread-safe.
class GrpcAggregatorClient final : public AggregatorClient {
 public:
  // `credentials` null = plaintext (tests).
  explicit GrpcAggregatorClient(std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : credentials_(std::move(credentials)) {}

  absl::StatusOr<uint64_t> PutModel(const std::string& address, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::FlatModel> model,
                                    const Caller& caller, absl::Time deadline) override;
  absl::StatusOr<bool> PushUpdate(const std::string& address, const v1::UpdateMeta& meta,
                                  std::shared_ptr<const tensor::FlatModel> delta,
                                  absl::Time deadline) override;
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string& task,
                                             uint64_t version, const Caller& caller,
                                             absl::Time deadline) override;
  absl::Status SetMembers(const std::string& address, const v1::SetMembersRequest& request,
                          absl::Time deadline) override;
  absl::Status OpenRound(const std::string& address, const v1::OpenRoundRequest& request,
                         absl::Time deadline) override;
  absl::StatusOr<v1::CloseRoundResponse> CloseRound(const std::string& address,
                                                    const v1::CloseRoundRequest& request,
                                                    absl::Time deadline) override;
  absl::Status ReleaseTask(const std::string& address, const std::string& task,
                           absl::Time deadline) override;

 private:
  struct Stub;
  std::shared_ptr<Stub> StubFor(const std::string& address);

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::aggregator
