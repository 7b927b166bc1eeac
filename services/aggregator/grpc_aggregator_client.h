#pragma once

#include <grpcpp/security/credentials.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/channel_cache.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/aggregator_client.h"

namespace shoal::aggregator {

// AggregatorClient over gRPC, with one channel per aggregator address (rpc::ChannelCache).
// Thread-safe.
class GrpcAggregatorClient final : public AggregatorClient {
 public:
  // `credentials` null = plaintext (tests); `connection`: rpc::Connection (benchmarks that play
  // several peers in one process give each client its own connections).
  explicit GrpcAggregatorClient(std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                                rpc::Connection connection = rpc::Connection::kShared)
      : channels_(std::move(credentials), connection) {}

  absl::StatusOr<uint64_t> PutModel(const std::string& address, const common::v1::ModelMeta& meta,
                                    std::shared_ptr<const tensor::EncodedModel> model,
                                    const Caller& caller, absl::Time deadline) override;
  absl::Status SecureAggregate(const std::string& address, const std::string& task, uint64_t round,
                               const Caller& caller, SecureParty& party,
                               absl::Time deadline) override;
  absl::StatusOr<bool> PushUpdate(const std::string& address, const v1::UpdateMeta& meta,
                                  std::shared_ptr<const tensor::EncodedModel> delta,
                                  absl::Time deadline) override;
  absl::StatusOr<bool> PushPartial(const std::string& address, const v1::PartialMeta& meta,
                                   absl::string_view bytes, absl::Time deadline) override;
  absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address, const std::string& task,
                                             uint64_t version, const Caller& caller,
                                             absl::Time deadline,
                                             std::vector<float> buffer = {}) override;
  absl::StatusOr<ModelDownload> GetModelInto(const std::string& address, const std::string& task,
                                             uint64_t version, const Caller& caller,
                                             absl::Time deadline, const tensor::WriteValues& write,
                                             const HeldModel* held) override;
  absl::Status SetMembers(const std::string& address, const v1::SetMembersRequest& request,
                          absl::Time deadline) override;
  absl::Status OpenRound(const std::string& address, const v1::OpenRoundRequest& request,
                         absl::Time deadline) override;
  absl::StatusOr<v1::CloseRoundResponse> CloseRound(const std::string& address,
                                                    const v1::CloseRoundRequest& request,
                                                    absl::Time deadline) override;
  absl::Status OpenBuffer(const std::string& address, const v1::OpenBufferRequest& request,
                          absl::Time deadline) override;
  absl::StatusOr<std::optional<uint64_t>> ReleaseTask(const std::string& address,
                                                      const std::string& task,
                                                      absl::Time deadline) override;
  absl::StatusOr<bool> PullModel(const std::string& address, const v1::PullModelRequest& request,
                                 absl::Time deadline) override;
  std::unique_ptr<AggregatorWatch> WatchTask(const std::string& address, const std::string& task,
                                             TaskEventFn on_event, WatchDoneFn on_done) override;

 private:
  // GetModel and GetModelInto (`write` empty: the values are kept, in `buffer`'s storage;
  // `held` null: raw).
  absl::StatusOr<tensor::ReceivedModel> Download(const std::string& address,
                                                 const std::string& task, uint64_t version,
                                                 const Caller& caller, absl::Time deadline,
                                                 tensor::WriteValues write, const HeldModel* held,
                                                 std::vector<float> buffer = {});
  rpc::ChannelCache channels_;
  // Records `bytes` moved over `link` in `took`, replacing what was there or only where nothing
  // was.
  void RecordRate(const std::pair<std::string, std::string>& link, uint64_t bytes,
                  absl::Duration took, bool replace);

  // Per (aggregator address, task): the bytes per second the last download arrived at, from the
  // model's first message to its last, or before any download the upload of the initial model
  // (PutModel); sent with the next download (GetModelRequest.download_bytes_per_second).
  // Bounded: the oldest entry goes beyond kMaxRates.
  static constexpr size_t kMaxRates = 64;
  absl::Mutex rates_mu_;
  std::map<std::pair<std::string, std::string>, double> rates_ ABSL_GUARDED_BY(rates_mu_);
};

}  // namespace shoal::aggregator
