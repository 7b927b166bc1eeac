#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/model.pb.h"

namespace shoal::aggregator {

// Who a peer-data call is made for: the peer's id and session token (both empty for the
// coordinator's own calls).
struct Caller {
  std::string peer_id;
  std::string session_token;
};

// One peer's side of a secure-aggregation round (AggregatorClient::SecureAggregate):
// SecureParticipant (secure_participant.h).
class SecureParty {
 public:
  virtual ~SecureParty() = default;
  // The reply to the aggregator's message; nullopt after `done` (the peer's part is over). An
  // error ends the peer's part.
  virtual absl::StatusOr<std::optional<v1::SecureAggregationRequest>> Answer(
      const v1::SecureAggregationResponse& message) = 0;
  // An answer once it is written whole (one message), handed back so that the party may keep its
  // memory for a later round; the default drops it.
  virtual void Recycle(v1::SecureAggregationRequest sent) { (void)sent; }
};

// A watch of one task at an aggregator (AggregatorService.WatchTask), from AggregatorClient::
// WatchTask. Destroying it cancels the stream and blocks until its callbacks have returned, so
// its owner must not hold a lock the callbacks take when it destroys one.
class AggregatorWatch {
 public:
  virtual ~AggregatorWatch() = default;
};

// Client of AggregatorService, used by peers (models and deltas) and by the coordinator (rounds,
// checkpoints, watches). An interface: the gRPC implementation is GrpcAggregatorClient
// (grpc_aggregator_client.h, its own target), tests use in-memory ones (tests/fakes). One attempt
// per call, bounded by `deadline`; retrying is the caller's business (the gRPC channel itself
// retries UNAVAILABLE). Errors name the call and the aggregator. Implementations are thread-safe.
class AggregatorClient {
 public:
  virtual ~AggregatorClient() = default;

  using TaskEventFn = std::function<void(const v1::TaskEvent&)>;
  using WatchDoneFn = std::function<void(const absl::Status&)>;
  // Starts watching `task` at `address`: `on_event` gets the stream's events in order (first
  // WatchStarted), then `on_done` gets how the stream ended, once (CANCELLED when the watch was
  // destroyed; UNAVAILABLE when the aggregator is gone). Both run on a client thread and must
  // not block. No deadline: the stream lasts until cancelled or broken (keepalive notices a
  // silent peer).
  virtual std::unique_ptr<AggregatorWatch> WatchTask(const std::string& address,
                                                     const std::string& task, TaskEventFn on_event,
                                                     WatchDoneFn on_done) = 0;

  // Uploads a whole model (AggregatorService.PutModel), raw (tensor::EncodeRaw of a model in
  // memory or of a mapped model file). Returns the aggregator's digest. The model is shared
  // because the transport sends straight from its memory.
  virtual absl::StatusOr<uint64_t> PutModel(const std::string& address,
                                            const common::v1::ModelMeta& meta,
                                            std::shared_ptr<const tensor::EncodedModel> model,
                                            const Caller& caller, absl::Time deadline) = 0;
  // Pushes a delta, raw or compressed (AggregatorService.PushUpdate). Returns `duplicate`.
  virtual absl::StatusOr<bool> PushUpdate(const std::string& address, const v1::UpdateMeta& meta,
                                          std::shared_ptr<const tensor::EncodedModel> delta,
                                          absl::Time deadline) = 0;
  // Secure aggregation (AggregatorService.SecureAggregate): joins `round` of `task` as `caller`
  // and answers the aggregator's messages with `party` until `done`. This default: UNIMPLEMENTED
  // (GrpcAggregatorClient implements it).
  virtual absl::Status SecureAggregate(const std::string& address, const std::string& task,
                                       uint64_t round, const Caller& caller, SecureParty& party,
                                       absl::Time deadline) {
    return absl::UnimplementedError("this aggregator client has no secure aggregation");
  }
  // Sends a child round's partial sum to its parent (AggregatorService.PushPartial): `meta`,
  // then `bytes` (partial_wire.h) in chunks. Returns `duplicate`.
  virtual absl::StatusOr<bool> PushPartial(const std::string& address, const v1::PartialMeta& meta,
                                           absl::string_view bytes, absl::Time deadline) = 0;
  // A version the caller holds, which a download may come encoded against
  // (GetModelRequest.base_version, tensor.proto ENCODING_XOR_SPARSE_ZLIB): its values, read by
  // element.
  struct HeldModel {
    uint64_t version = 0;
    tensor::ReadValues read;
  };
  // What GetModelInto received: the model's layout and the payload bytes that came (fewer than
  // the layout's float32 bytes when the model came against a held version).
  struct ModelDownload {
    tensor::ModelLayout layout;
    uint64_t payload_bytes = 0;
  };
  // Downloads model `version` of `task` (AggregatorService.GetModel), into `buffer`'s storage
  // (pass a recycled model-sized buffer: a fresh one costs the first touch of each of its pages).
  virtual absl::StatusOr<tensor::FlatModel> GetModel(const std::string& address,
                                                     const std::string& task, uint64_t version,
                                                     const Caller& caller, absl::Time deadline,
                                                     std::vector<float> buffer = {}) = 0;
  // The same, the values handed to `write` as they arrive instead of kept, so a download needs
  // no model-sized buffer; returns the model's layout and the bytes received. What `write` got is
  // verified only when the call succeeds (a failed call may have written part of a model). With
  // `held`, the model may come encoded against it and is rebuilt and verified against its digests
  // as it arrives. This default downloads the whole model raw and then writes it;
  // GrpcAggregatorClient streams.
  virtual absl::StatusOr<ModelDownload> GetModelInto(const std::string& address,
                                                     const std::string& task, uint64_t version,
                                                     const Caller& caller, absl::Time deadline,
                                                     const tensor::WriteValues& write,
                                                     const HeldModel* held) {
    absl::StatusOr<tensor::FlatModel> model = GetModel(address, task, version, caller, deadline);
    if (!model.ok()) return model.status();
    if (absl::Status s = write(0, model->values); !s.ok()) return s;
    const uint64_t bytes = model->layout.total_bytes();
    return ModelDownload{std::move(model->layout), bytes};
  }
  // Replaces the task's members and their session tokens (the coordinator's call).
  virtual absl::Status SetMembers(const std::string& address, const v1::SetMembersRequest& request,
                                  absl::Time deadline) = 0;
  virtual absl::Status OpenRound(const std::string& address, const v1::OpenRoundRequest& request,
                                 absl::Time deadline) = 0;
  virtual absl::StatusOr<v1::CloseRoundResponse> CloseRound(const std::string& address,
                                                            const v1::CloseRoundRequest& request,
                                                            absl::Time deadline) = 0;
  virtual absl::Status OpenBuffer(const std::string& address, const v1::OpenBufferRequest& request,
                                  absl::Time deadline) = 0;
  // Returns the newest version the aggregator held of the task (none: it held none).
  virtual absl::StatusOr<std::optional<uint64_t>> ReleaseTask(const std::string& address,
                                                              const std::string& task,
                                                              absl::Time deadline) = 0;
  // Has a child supernode fetch a version from its parent (AggregatorService.PullModel).
  // Returns whether it fetched (false: it held the version).
  virtual absl::StatusOr<bool> PullModel(const std::string& address,
                                         const v1::PullModelRequest& request,
                                         absl::Time deadline) = 0;
};

}  // namespace shoal::aggregator
