#pragma once

#include "absl/status/status.h"
#include "services/aggregator/core_types.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// How a tree node's aggregate reaches its parent aggregator (PushPartial): the gRPC client in
// the server, a fake in tests. AggregatorCore calls it on its transfer pool, never on a thread
// that folds, with no lock held; it retries what the parent answers as temporary. Thread-safe.
class ParentLink {
 public:
  virtual ~ParentLink() = default;
  // Sends `partial` as child `parent.child()`'s to the aggregator at `parent.address()`. Blocks.
  virtual absl::Status Send(const v1::ParentRound& parent, const PartialResult& partial) = 0;
};

}  // namespace shoal::aggregator
