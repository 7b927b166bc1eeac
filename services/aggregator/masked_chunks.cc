#include "services/aggregator/masked_chunks.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal::aggregator {

bool WriteMaskedInChunks(v1::SecureAggregationRequest request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes) {
  return WriteMaskedChunksOf(request, write, chunk_bytes);
}

bool WriteMaskedChunksOf(v1::SecureAggregationRequest& request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes) {
  if (!request.has_masked() || request.masked().input().values().size() <= chunk_bytes) {
    return write(request);
  }
  std::string& field = *request.mutable_masked()->mutable_input()->mutable_values();
  std::string values = std::move(field);
  field.clear();
  const absl::string_view all = values;
  // The first chunk keeps the update's other fields; the later ones only the participant.
  v1::SecureAggregationRequest chunk = request;
  bool open = true;
  for (size_t at = 0; open && at < all.size(); at += chunk_bytes) {
    if (at > 0) {
      v1::SecureMaskedUpdate& masked = *chunk.mutable_masked();
      masked.clear_num_samples();
      masked.clear_train_loss();
      masked.clear_train_ms();
    }
    const absl::string_view part = all.substr(at, chunk_bytes);
    chunk.mutable_masked()->mutable_input()->set_values(part.data(), part.size());
    open = write(chunk);
  }
  *request.mutable_masked()->mutable_input()->mutable_values() = std::move(values);
  return open;
}

absl::StatusOr<std::optional<v1::SecureAggregationRequest>> MaskedUpdateAssembler::Add(
    v1::SecureAggregationRequest message) {
  if (!pending_.has_value()) {
    pending_ = std::move(message);
    std::string& values = *pending_->mutable_masked()->mutable_input()->mutable_values();
    if (values.size() < update_bytes_) values.reserve(update_bytes_);
  } else {
    const privacy::v1::MaskedInput& chunk = message.masked().input();
    privacy::v1::MaskedInput& whole = *pending_->mutable_masked()->mutable_input();
    if (chunk.participant_id() != whole.participant_id()) {
      const std::string first = whole.participant_id();
      pending_.reset();
      return absl::InvalidArgumentError(absl::StrCat("a chunk of the masked update of '",
                                                     EscapeBytes(first), "' names '",
                                                     EscapeBytes(chunk.participant_id()), "'"));
    }
    whole.mutable_values()->append(chunk.values());
  }
  const size_t have = pending_->masked().input().values().size();
  if (have > update_bytes_) {
    pending_.reset();
    return absl::InvalidArgumentError(absl::StrCat("the masked update's chunks carry ", have,
                                                   " bytes or more; the round takes ",
                                                   update_bytes_));
  }
  if (have < update_bytes_) return std::nullopt;
  std::optional<v1::SecureAggregationRequest> whole = std::move(pending_);
  pending_.reset();
  return whole;
}

}  // namespace shoal::aggregator
