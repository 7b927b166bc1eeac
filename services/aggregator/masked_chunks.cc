#include "services/aggregator/masked_chunks.h"

#include <string>
#include <utility>

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

}  // namespace shoal::aggregator
