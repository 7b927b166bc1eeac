#pragma once

// A light peer's side of a secure-aggregation round (tests/bench/light_peer.h, Options::secure):
// shoal-peer's SecureParticipant, with the bytes counted each way and, for peers told to drop,
// the round abandoned once the masked update is sent.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "libs/privacy/secagg/identity.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/secure_participant.h"

namespace shoal::bench {

// An Ed25519 identity key: the signer and its public half (Hello.identity_public_key).
struct LightIdentity {
  std::shared_ptr<const privacy::secagg::KeySigner> signer;
  std::string public_key;
};
absl::StatusOr<LightIdentity> MakeLightIdentity();

// SecureParticipant's answers, counted (the serialized size of each message). With
// `drop_after_masking` the peer refuses the step after its masked update (the consistency check):
// the client cancels the stream, and the aggregator sees the peer leave after masking, as when its
// process dies then. `on_masked` is called when the masked update is answered.
class BenchSecureParty final : public aggregator::SecureParty {
 public:
  BenchSecureParty(aggregator::SecureContribution contribution, bool drop_after_masking,
                   std::function<void()> on_masked);

  absl::StatusOr<std::optional<aggregator::v1::SecureAggregationRequest>> Answer(
      const aggregator::v1::SecureAggregationResponse& message) override;
  void Recycle(aggregator::v1::SecureAggregationRequest sent) override {
    participant_.Recycle(std::move(sent));
  }

  // The steps of a round, as the aggregator's messages start them.
  enum Step { kAdvertise = 0, kShare = 1, kMask = 2, kCheck = 3, kUnmask = 4, kSteps = 5 };
  static const char* StepName(int step);

  int64_t bytes_sent() const { return sent_; }
  int64_t bytes_received() const { return received_; }
  // The peer dropped out as it was told to (its SecureAggregate call then fails by design).
  bool dropped() const { return dropped_; }
  // This thread's CPU time in SecureParticipant, by step, in microseconds: keys made and signed
  // (advertise), shares sealed (share), the update clipped, encoded and masked (mask), the
  // survivor list signed (check), the list's signatures verified and shares revealed (unmask).
  const std::array<int64_t, kSteps>& cpu_us() const { return cpu_us_; }

 private:
  aggregator::SecureParticipant participant_;
  const bool drop_after_masking_;
  const std::function<void()> on_masked_;
  bool masked_ = false;
  bool dropped_ = false;
  int64_t sent_ = 0;
  int64_t received_ = 0;
  std::array<int64_t, kSteps> cpu_us_{};
};

}  // namespace shoal::bench
