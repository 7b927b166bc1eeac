#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/modes/aggregator_mode_task.h"

namespace shoal::coordinator {

// The coordinator side of a federated-async task (docs/explanation/federated-async.md): Disco's
// buffered asynchronous scheme (the FedBuff family) through the task's aggregator.
//
// Once the aggregator holds a model (GlobalModel) and min_participants peers are present, the
// mode opens the aggregator's update buffer (kOpenBuffer: buffer_size, staleness rule, strategy,
// last version = spec.rounds) and tells every peer TrainAsync: peers train and push at their own
// pace, never waiting for each other. The aggregator decides everything per update (staleness,
// replacement, when the buffer is full) and announces each version it publishes on its watch
// stream (VersionPublished). For each version the mode records a history entry (its "round" is
// the version), checkpoints it and publishes it for evaluation (ModelPublished; a peer may skip
// versions). After the last version it waits for the final evaluation, then completes.
//
// On a tree (topology hierarchical, docs/explanation/federated-async.md, "On a tree") the buffer
// opens at every node with peers below it (kOpenBuffer on the tree), each sized by what pushes into
// it; a node below the root sends each full buffer's aggregate to its parent as one update, and
// only the root publishes. A version reaches the peers once every node has fetched it from its
// parent (kPullTree), then ModelPublished. When peers join or leave, the buffers are opened again
// with their new sizes (their updates stay); a peer that joins trains once that is done.
//
// Losing the aggregator: on the next one the newest checkpoint is restored, the buffer is opened
// again and every peer is told TrainAsync again. Owned by CoordinatorCore (one per task). Not
// thread-safe: driven under the core's lock.
class FederatedAsyncTask final : public AggregatorModeTask {
 public:
  FederatedAsyncTask(const v1::TaskStatus& status, const ModeOptions& options,
                     CoordinatorMetrics& metrics);

  void AddPeer(const ModePeer& peer, absl::Time now, v1::TaskStatus& status,
               ModeEffects& fx) override;
  void RemovePeer(const std::string& peer_id, const std::string& why, absl::Time now,
                  v1::TaskStatus& status, ModeEffects& fx) override;
  void OnAggregatorEvent(const aggregator::v1::TaskEvent& event, absl::Time now,
                         v1::TaskStatus& status, ModeEffects& fx) override;
  void OnWorkDone(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                  ModeEffects& fx) override;

 private:
  void Advance(absl::Time now, v1::TaskStatus& status, ModeEffects& fx) override;
  // The buffer is gone with the aggregator (or never opened): start over from the model.
  void Reset(v1::TaskStatus& status) override;
  void OnBufferOpened(const WorkResult& result, absl::Time now, v1::TaskStatus& status,
                      ModeEffects& fx);
  void OnVersion(const aggregator::v1::VersionPublished& v, absl::Time now, v1::TaskStatus& status,
                 ModeEffects& fx);
  v1::CoordinatorEvent TrainEvent(const v1::TaskStatus& status) const;
  // The per-peer view of task status (updates each peer contributed).
  void PublishPeers(v1::TaskStatus& status) const;
  // kOpenBuffer on the current version, for the current peers.
  void AskOpen(const v1::TaskStatus& status, ModeEffects& fx);
  // ModelPublished for `version` to every peer.
  void Publish(uint64_t version, ModeEffects& fx) const;
  // The last version is out: the task completes once it is evaluated (or at the deadline).
  void EvaluateLast(absl::Time now, v1::TaskStatus& status, ModeEffects& fx);

  const bool tree_;               // topology hierarchical
  bool opening_ = false;          // kOpenBuffer in flight
  bool buffer_open_ = false;      // peers train and push
  bool reopen_ = false;           // a tree's peers changed: open its buffers again
  std::set<std::string> joined_;  // on a tree: peers that train once the buffers are reopened
  uint64_t pulled_ = 0;           // on a tree: the newest version its nodes fetched
  absl::Time last_version_at_;
  absl::Time eval_deadline_;
  std::map<std::string, uint64_t> contributions_;  // peer -> updates in published versions
};

// The mode registry's factory (services/coordinator/mode_registry.cc).
std::unique_ptr<ModeTask> MakeFederatedAsyncTask(const v1::TaskStatus& status,
                                                 const ModeOptions& options,
                                                 CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
