#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "libs/common/executor.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/core_types.h"
#include "services/aggregator/parent_link.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// A federated-async tree node's way up: its aggregates go to the parent over the ParentLink in
// order, on one transfer thread of the forwarder's own, so sending (and waiting between retries)
// never holds up a fold. A parent that answers as temporarily away (UNAVAILABLE,
// RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ABORTED) gets the aggregate again, a few times; then
// it is logged and counted as lost (shoal_aggregator_partials_lost_total), its updates lost as an
// abandoned round's. Thread-safe.
class ParentForwarder {
 public:
  // `recycle` takes each aggregate's buffer back once it was sent or given up on (on the transfer
  // thread, with no lock of the forwarder held).
  ParentForwarder(AggregatorMetrics& metrics, std::function<void(std::vector<float>)> recycle);
  // Sends what is queued, then joins the transfer thread.
  ~ParentForwarder();

  // Set once, before the first Forward; without a link every aggregate is lost.
  void SetLink(ParentLink* link) { link_ = link; }
  // Queues `aggregate` for `parent`. With no room (over 1024 queued, or while destroyed) it is
  // lost at once.
  void Forward(const v1::ParentRound& parent, PartialResult aggregate) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every aggregate queued was sent or given up on.
  void AwaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Send(const v1::ParentRound& parent, const PartialResult& aggregate);
  void Done() ABSL_LOCKS_EXCLUDED(mu_);

  AggregatorMetrics& metrics_;
  const std::function<void(std::vector<float>)> recycle_;
  ParentLink* link_ = nullptr;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being sent
  // Last member: destroyed (drained and joined) first.
  std::unique_ptr<ThreadPool> transfers_;
};

}  // namespace shoal::aggregator
