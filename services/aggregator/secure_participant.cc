#include "services/aggregator/secure_participant.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/privacy/secagg/update_codec.h"

namespace shoal::aggregator {

namespace secagg = privacy::secagg;

SecureParticipant::SecureParticipant(SecureContribution contribution)
    : contribution_(std::move(contribution)) {}

absl::StatusOr<v1::SecureAggregationRequest> SecureParticipant::Start(
    const v1::SecureAggregationStart& start) {
  const privacy::v1::SecAggConfig& config = start.config();
  // The aggregator may not add, drop or rename participants: they are the coordinator's.
  const std::set<std::string> listed(config.participant_ids().begin(),
                                     config.participant_ids().end());
  std::set<std::string> known;
  for (const auto& [id, key] : contribution_.identity_keys) known.insert(id);
  if (listed != known || static_cast<size_t>(config.participant_ids_size()) != listed.size()) {
    return absl::FailedPreconditionError(
        "the aggregator's secure-aggregation participants are not the coordinator's");
  }
  if (start.base_version() != contribution_.base_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("the aggregator's secure round is on version ", start.base_version(), ", not ",
                     contribution_.base_version));
  }
  if (config.vector_length() != update().size()) {
    return absl::FailedPreconditionError(absl::StrCat("the secure round takes ",
                                                      config.vector_length(),
                                                      " values; the update has ", update().size()));
  }
  absl::StatusOr<std::unique_ptr<secagg::Ed25519KeyVerifier>> verifier =
      secagg::Ed25519KeyVerifier::Create(contribution_.identity_keys);
  if (!verifier.ok()) return verifier.status();
  absl::StatusOr<std::unique_ptr<secagg::SecAggClient>> client = secagg::SecAggClient::Create(
      config, contribution_.peer_id, contribution_.signer, *std::move(verifier));
  if (!client.ok()) return client.status();
  absl::StatusOr<privacy::FixedPointCodec> codec = secagg::UpdateCodec(
      start.clip_norm(), config.participant_ids_size(), contribution_.noise_stddev);
  if (!codec.ok()) return codec.status();
  client_ = *std::move(client);
  codec_ = *std::move(codec);
  absl::StatusOr<privacy::v1::AdvertisedKeys> keys = client_->AdvertiseKeys();
  if (!keys.ok()) return keys.status();
  v1::SecureAggregationRequest request;
  *request.mutable_keys() = *std::move(keys);
  return request;
}

absl::StatusOr<v1::SecureAggregationRequest> SecureParticipant::Mask(
    const privacy::v1::EncryptedShares& shares) {
  // Clipped (or clamped), encoded and masked a block at a time, straight into the message.
  absl::StatusOr<secagg::UpdateEncoder> encoder =
      contribution_.noise_stddev > 0 ? secagg::UpdateEncoder::Clamp(*codec_, update())
                                     : secagg::UpdateEncoder::Clip(*codec_, update());
  if (!encoder.ok()) return encoder.status();
  std::string buffer;
  if (contribution_.buffers != nullptr) buffer = std::move(contribution_.buffers->masked_values);
  absl::StatusOr<privacy::v1::MaskedInput> masked = client_->MaskInput(
      shares,
      [&encoder](size_t start, absl::Span<uint32_t> block) {
        return encoder->EncodeTo(start, block);
      },
      std::move(buffer));
  if (!masked.ok()) return masked.status();
  v1::SecureAggregationRequest request;
  v1::SecureMaskedUpdate& update = *request.mutable_masked();
  *update.mutable_input() = *std::move(masked);
  update.set_num_samples(contribution_.num_samples);
  update.set_train_loss(contribution_.train_loss);
  update.set_train_ms(contribution_.train_ms);
  return request;
}

void SecureParticipant::Recycle(v1::SecureAggregationRequest sent) {
  if (contribution_.buffers == nullptr || !sent.has_masked()) return;
  contribution_.buffers->masked_values =
      std::move(*sent.mutable_masked()->mutable_input()->mutable_values());
}

absl::StatusOr<std::optional<v1::SecureAggregationRequest>> SecureParticipant::Answer(
    const v1::SecureAggregationResponse& message) {
  v1::SecureAggregationRequest request;
  if (message.has_start()) {
    if (client_ != nullptr) return absl::FailedPreconditionError("a second secure round start");
    absl::StatusOr<v1::SecureAggregationRequest> started = Start(message.start());
    if (!started.ok()) return started.status();
    return *std::move(started);
  }
  if (client_ == nullptr) {
    return absl::FailedPreconditionError("the secure round did not start with its config");
  }
  switch (message.step_case()) {
    case v1::SecureAggregationResponse::kKeyBundle: {
      absl::StatusOr<privacy::v1::EncryptedShares> shares =
          client_->ShareKeys(message.key_bundle());
      if (!shares.ok()) return shares.status();
      *request.mutable_shares() = *std::move(shares);
      return request;
    }
    case v1::SecureAggregationResponse::kShares: {
      absl::StatusOr<v1::SecureAggregationRequest> masked = Mask(message.shares());
      if (!masked.ok()) return masked.status();
      return *std::move(masked);
    }
    case v1::SecureAggregationResponse::kConsistency: {
      absl::StatusOr<privacy::v1::ConsistencyCheckResponse> signature =
          client_->SignSurvivors(message.consistency());
      if (!signature.ok()) return signature.status();
      *request.mutable_consistency() = *std::move(signature);
      return request;
    }
    case v1::SecureAggregationResponse::kUnmask: {
      absl::StatusOr<privacy::v1::UnmaskResponse> unmask = client_->Unmask(message.unmask());
      if (!unmask.ok()) return unmask.status();
      *request.mutable_unmask() = *std::move(unmask);
      return request;
    }
    case v1::SecureAggregationResponse::kDone:
      survivors_.assign(message.done().survivors().begin(), message.done().survivors().end());
      return std::nullopt;
    default:
      return absl::InvalidArgumentError("an empty or unknown secure-aggregation message");
  }
}

}  // namespace shoal::aggregator
