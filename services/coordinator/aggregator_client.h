#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/tensor/flat_model.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"

namespace shoal::coordinator {

// What the coordinator asks of an aggregator. Every call blocks up to its deadline, so it is
// only ever called from the coordinator's driver thread, never under a lock or in a reaction.
class AggregatorClient {
 public:
  virtual ~AggregatorClient() = default;
  virtual absl::Status OpenRound(const std::string& address,
                                 const aggregator::v1::OpenRoundRequest& request) = 0;
  virtual absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string& address, const aggregator::v1::CloseRoundRequest& request) = 0;
  virtual absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address,
                                                     const std::string& task, uint64_t version) = 0;
  virtual absl::Status PutModel(const std::string& address, const std::string& task,
                                uint64_t version, const tensor::FlatModel& model) = 0;
  virtual absl::Status ReleaseTask(const std::string& address, const std::string& task) = 0;
};

// The gRPC implementation: one reused channel per aggregator address. Thread-safe.
class GrpcAggregatorClient final : public AggregatorClient {
 public:
  explicit GrpcAggregatorClient(std::shared_ptr<grpc::ChannelCredentials> credentials,
                                absl::Duration call_timeout = absl::Seconds(10),
                                absl::Duration transfer_timeout = absl::Minutes(5));
  absl::Status OpenRound(const std::string& address,
                         const aggregator::v1::OpenRoundRequest& request) override;
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseRound(
      const std::string& address, const aggregator::v1::CloseRoundRequest& request) override;
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string& task,
                                             uint64_t version) override;
  absl::Status PutModel(const std::string& address, const std::string& task, uint64_t version,
                        const tensor::FlatModel& model) override;
  absl::Status ReleaseTask(const std::string& address, const std::string& task) override;

 private:
  aggregator::v1::AggregatorService::Stub& StubFor(const std::string& address);

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const absl::Duration call_timeout_;
  const absl::Duration transfer_timeout_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<aggregator::v1::AggregatorService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator
