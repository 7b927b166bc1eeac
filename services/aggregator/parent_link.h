#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/aggregator/core_types.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// How a tree node's partial sum reaches its parent aggregator (PushPartial): the gRPC client in
// the server, a fake in tests. The one way up a tree: a child round's sum at its CloseRound
// (AggregatorServiceImpl, within the call's deadline) and a federated-async node's full
// buffers (AggregatorCore, on its transfer thread, never on one that folds). Thread-safe.
class ParentLink {
 public:
  virtual ~ParentLink() = default;
  // Sends `partial` as child `parent.child()`'s to the aggregator at `parent.address()`; blocks
  // until the parent answered or `deadline`. The parent's status as it answered.
  virtual absl::Status Send(const v1::ParentRound& parent, const PartialResult& partial,
                            absl::Time deadline) = 0;
};

}  // namespace shoal::aggregator
