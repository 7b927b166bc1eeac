#pragma once

// Step 3 of AggregatorService.SecureAggregate across several messages. A masked update holds 4
// bytes per model value, more than one message may carry (8 MiB here) once a model passes about
// two million values, so a peer sends it as a run of `masked` messages: the first carries
// num_samples, train_loss, train_ms and the first values; each later one only participant_id
// and the values that follow; the values concatenate, in order, to the round's vector_length x 4
// bytes. A model that fits one chunk may travel as one message, as before; shoal's peers
// (GrpcAggregatorClient) write 256 KiB chunks, whose serialized copies reuse memory. The
// aggregator folds each message into the round's sum as it comes (SecureExchange::Receive).

#include <cstddef>
#include <functional>

#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The values one `masked` message carries at most: 1,048,576 ring values.
inline constexpr size_t kMaskedChunkBytes = size_t{4} << 20;

// Writes `request` through `write`: as it is unless it is a masked update whose values exceed
// `chunk_bytes`, else as that update's chunks. Stops at the first write that returns false and
// returns false.
bool WriteMaskedInChunks(v1::SecureAggregationRequest request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes = kMaskedChunkBytes);

// As WriteMaskedInChunks, the same messages, and `request` is left as it was (its values' buffer
// with it, for the caller to reuse).
bool WriteMaskedChunksOf(v1::SecureAggregationRequest& request,
                         const std::function<bool(const v1::SecureAggregationRequest&)>& write,
                         size_t chunk_bytes);

}  // namespace shoal::aggregator
