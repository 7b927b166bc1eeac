#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/secagg/client.h"
#include "libs/privacy/secagg/identity.h"
#include "services/aggregator/aggregator_client.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// Memory a peer keeps from one secure round to the next (owned by what outlives the rounds), so
// that a round does not fault in fresh pages for its masked update: the buffer of the masked
// values, handed back once the message is written (SecureParty::Recycle).
struct SecureBuffers {
  std::string masked_values;
};

// What a peer brings to a secure-aggregation round.
struct SecureContribution {
  std::string peer_id;
  // Its identity key (signs its advertised keys), and every participant's identity public key as
  // the coordinator gave them (RoundStarted.identity_keys), its own included.
  std::shared_ptr<const privacy::secagg::KeySigner> signer;
  std::map<std::string, std::string> identity_keys;
  uint64_t base_version = 0;
  std::vector<float> update;  // the delta, every value of the model
  // When not empty, the delta instead of `update`, read in place: it must outlive the participant.
  absl::Span<const float> update_view;
  // Optional, and must outlive the participant: buffers reused across rounds.
  SecureBuffers* buffers = nullptr;
  // With peer-level DP's distributed noise: the noise `update` already carries per value (it was
  // clipped before); the values are then clamped to the round's range, not clipped again.
  double noise_stddev = 0;
  uint64_t num_samples = 0;
  double train_loss = 0;
  int64_t train_ms = 0;
};

// One peer's side of a secure-aggregation round (AggregatorService.SecureAggregate): checks what
// the aggregator sends against what the coordinator said, and answers each step with a
// SecAggClient (libs/privacy/secagg/client.h). The update is clipped to the round's clip norm
// and encoded in fixed point (libs/privacy/secagg/update_codec.h) before it is masked. Refuses
// (FAILED_PRECONDITION, UNAUTHENTICATED from the client) a round whose participants are not
// exactly the coordinator's, another base version, a key that does not verify, an unmask request
// without threshold signatures of the survivor list it signed. Not thread-safe.
class SecureParticipant final : public SecureParty {
 public:
  explicit SecureParticipant(SecureContribution contribution);

  absl::StatusOr<std::optional<v1::SecureAggregationRequest>> Answer(
      const v1::SecureAggregationResponse& message) override;
  // Keeps the masked update's buffer in the contribution's SecureBuffers, if it has them.
  void Recycle(v1::SecureAggregationRequest sent) override;

  // From `done`: the peers whose updates are in the sum.
  const std::vector<std::string>& survivors() const { return survivors_; }
  // Whether it got the round's start and so advertised (or made) its keys for the round.
  bool started() const { return client_ != nullptr; }

 private:
  absl::StatusOr<v1::SecureAggregationRequest> Start(const v1::SecureAggregationStart& start);
  absl::StatusOr<v1::SecureAggregationRequest> Mask(const privacy::v1::EncryptedShares& shares);
  absl::Span<const float> update() const {
    return contribution_.update_view.empty() ? absl::MakeConstSpan(contribution_.update)
                                             : contribution_.update_view;
  }

  SecureContribution contribution_;
  std::unique_ptr<privacy::secagg::SecAggClient> client_;
  std::optional<privacy::FixedPointCodec> codec_;
  std::vector<std::string> survivors_;
};

}  // namespace shoal::aggregator
