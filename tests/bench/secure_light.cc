#include "tests/bench/secure_light.h"

#include <time.h>

#include <utility>

#include "libs/common/status_macros.h"
#include "libs/privacy/crypto.h"

namespace shoal::bench {

absl::StatusOr<LightIdentity> MakeLightIdentity() {
  SHOAL_ASSIGN_OR_RETURN(privacy::KeyPair pair, privacy::GenerateEd25519KeyPair());
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<privacy::secagg::Ed25519KeySigner> signer,
                         privacy::secagg::Ed25519KeySigner::Create(pair.private_key));
  return LightIdentity{std::move(signer), pair.public_key};
}

namespace {

int64_t ThreadCpuMicros() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000 + t.tv_nsec / 1000;
}

}  // namespace

const char* BenchSecureParty::StepName(int step) {
  static const char* const kNames[kSteps] = {"advertise", "share", "mask", "check", "unmask"};
  return step >= 0 && step < kSteps ? kNames[step] : "?";
}

BenchSecureParty::BenchSecureParty(aggregator::SecureContribution contribution,
                                   bool drop_after_masking, std::function<void()> on_masked)
    : participant_(std::move(contribution)),
      drop_after_masking_(drop_after_masking),
      on_masked_(std::move(on_masked)) {}

absl::StatusOr<std::optional<aggregator::v1::SecureAggregationRequest>> BenchSecureParty::Answer(
    const aggregator::v1::SecureAggregationResponse& message) {
  received_ += static_cast<int64_t>(message.ByteSizeLong());
  if (masked_ && drop_after_masking_ && !message.has_done()) {
    dropped_ = true;
    return absl::CancelledError("this light peer drops out after masking (shoal-sim)");
  }
  const int64_t cpu_start = ThreadCpuMicros();
  absl::StatusOr<std::optional<aggregator::v1::SecureAggregationRequest>> answer =
      participant_.Answer(message);
  int step = -1;
  switch (message.step_case()) {
    case aggregator::v1::SecureAggregationResponse::kStart:
      step = kAdvertise;
      break;
    case aggregator::v1::SecureAggregationResponse::kKeyBundle:
      step = kShare;
      break;
    case aggregator::v1::SecureAggregationResponse::kShares:
      step = kMask;
      break;
    case aggregator::v1::SecureAggregationResponse::kConsistency:
      step = kCheck;
      break;
    case aggregator::v1::SecureAggregationResponse::kUnmask:
      step = kUnmask;
      break;
    default:
      break;
  }
  if (step >= 0) cpu_us_[step] += ThreadCpuMicros() - cpu_start;
  if (!answer.ok() || !answer->has_value()) return answer;
  sent_ += static_cast<int64_t>((*answer)->ByteSizeLong());
  if ((*answer)->has_masked()) {
    masked_ = true;
    on_masked_();
  }
  return answer;
}

}  // namespace shoal::bench
