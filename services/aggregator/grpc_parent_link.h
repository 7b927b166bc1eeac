#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/aggregator/aggregator_client.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/parent_link.h"

namespace shoal::aggregator {

// Partial sums go up a tree with PushPartial (a child round's, or with round 0 a federated-async
// node's aggregate), over the client that fetches models from the parent, with this
// aggregator's certificate; the bytes sent are counted.
class GrpcParentLink final : public ParentLink {
 public:
  GrpcParentLink(AggregatorClient& parents, AggregatorMetrics& metrics)
      : parents_(parents), metrics_(metrics) {}

  absl::Status Send(const v1::ParentRound& parent, const PartialResult& partial,
                    absl::Time deadline) override;

 private:
  AggregatorClient& parents_;
  AggregatorMetrics& metrics_;
};

}  // namespace shoal::aggregator
