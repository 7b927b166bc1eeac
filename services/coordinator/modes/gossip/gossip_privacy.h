#pragma once

// privacy.dp at level sample in a gossip task: the epsilon its peers' DP-SGD steps have spent,
// shown in TaskStatus.privacy. A peer's records are touched only by its own DP-SGD steps; the
// models it serves and interpolates with are post-processing of those steps and of other peers'
// (adaptive composition), so a record's epsilon is that of its peer's steps at sampling rate
// q = batch_size / the peer's training samples (its DataReport), and the task's is the largest
// over its peers. The peers train their rounds x round_batches steps whatever that spends:
// gossip takes no target_epsilon (task_privacy.cc).
//
// Not thread-safe: driven under the core's lock, like the GossipTask that owns it.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "services/coordinator/coordinator_metrics.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

class GossipPrivacy {
 public:
  GossipPrivacy(common::v1::TaskSpec spec, CoordinatorMetrics& metrics);

  // Whether the task asks for DP (privacy.dp); without it Update does nothing.
  bool enabled() const { return enabled_; }

  // Fills status.privacy from the steps each peer trained (peer id -> steps; a peer's count
  // never goes down, and a peer that left still counts) and the peers' data reports
  // (status.data; a peer without one is not counted yet): epsilon, steps and sampling rate of
  // the peer whose records are the least hidden, rounds = `rounds` (every member's round_batches
  // steps done), that peer's accountant state. A coordinator restart forgets the peers that
  // left before it.
  void Update(const std::map<std::string, uint64_t>& steps, uint64_t rounds,
              v1::TaskStatus& status);

 private:
  struct Spent {
    double q = 0;
    uint64_t steps = 0;
    double epsilon = 0;
    std::vector<double> orders, rdp;
  };
  // The epsilon of `steps` steps at `q`, remembered per peer (recomputed when either changes).
  const Spent& SpentBy(const std::string& peer, double q, uint64_t steps);

  const common::v1::TaskSpec spec_;
  CoordinatorMetrics& metrics_;
  const bool enabled_;
  std::map<std::string, Spent> spent_;
};

}  // namespace shoal::coordinator
