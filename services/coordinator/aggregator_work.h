#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/common/executor.h"
#include "services/aggregator/aggregator_client.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/mode_task.h"
#include "services/coordinator/task_store.h"

namespace shoal::coordinator {

// What a task's aggregator work runs on: its root and, with topology hierarchical, the
// aggregators of its clusters below it, each the child of another
// (docs/explanation/supernode-trees.md).
struct AggregatorTree {
  struct Node {
    std::string address;
    std::string id;                            // its id as its parent's child ("" for the root)
    std::set<std::string> peers;               // its cluster
    size_t parent = 0;                         // index in `nodes`
    size_t level = 0;                          // 0: the root; a child's is its parent's + 1
    std::vector<std::string> backups = {};     // replicas: its standbys, given its updates
    std::vector<std::string> backup_ids = {};  // their ids as children (as `id` is this one's)
    // Its own id as a child: `id`, unless it took over the cluster of another (whose id the
    // cluster keeps). Its backups know its copies by it.
    std::string self_id = "";
  };
  std::vector<Node> nodes;  // nodes[0] is the root; every node comes after its parent
  bool hierarchical = false;
  const std::string& root() const { return nodes.front().address; }
};

struct AggregatorWorkOptions {
  absl::Duration call_timeout = absl::Seconds(10);     // OpenRound, CloseRound, SetMembers...
  absl::Duration transfer_timeout = absl::Minutes(5);  // checkpoints and restores
  // Checkpoints kept per task, the newest (0: every one). Older ones lose their record and, where
  // no kept record names it, their file.
  size_t keep_checkpoints = 3;
};

// Runs the coordinator's calls to aggregators off the gRPC threads. Each task has two queues on
// the shared executors: one for its control calls (members, rounds, release), in the order asked,
// and one for the calls that move a whole model (checkpoint, restore), so that a long transfer
// delays neither its own task's rounds nor any other task. Results go to the given callbacks on
// the executor's thread. Thread-safe; Drain() (or the destructor) waits for everything posted.
class AggregatorWorkRunner {
 public:
  using DoneFn = std::function<void(WorkResult)>;

  AggregatorWorkRunner(aggregator::AggregatorClient& client, TaskStore& store, Executor& calls,
                       Executor& transfers, const Clock& clock, CoordinatorMetrics& metrics,
                       AggregatorWorkOptions options);
  ~AggregatorWorkRunner();

  // Runs `work` for `task` on `tree`; `done` gets the result. A round of a hierarchical task
  // runs on the aggregators of the tree with peers in the round below them: OpenRound from the
  // root down (each with its cluster's peers, its children, its parent), CloseRound from the
  // deepest up (each sends its partial sum to its parent; the root's answer is the result),
  // then every node fetches the new version from its parent (PullModel), from the top down, for
  // its peers. Any other work runs at the root.
  void Run(const std::string& task, AggregatorTree tree, AggregatorWork work, DoneFn done);
  // Sets the task's members at the aggregator, in order with the task's control calls.
  void SetMembers(const std::string& task, const std::string& address,
                  aggregator::v1::SetMembersRequest request,
                  std::function<void(absl::Status)> done);
  // Frees the task at the aggregator (fire and forget; a failure is logged).
  void Release(const std::string& task, const std::string& address);
  // Replicas: `backup` takes over from the lost `primary` of a cluster or the root, in order
  // with the task's control calls. When the task's open round has a standby round at `backup`,
  // that round is opened again without standby_for (it keeps the copies it took; its own copies
  // go out as `backup_id`, to the node's other backups, told so) and its CloseRound goes to
  // `backup` from then on; the root's children (and their backups) are opened again with
  // `backup` as their parent, so that their partial sums go there. Otherwise the next round
  // opens on the new tree. `done` gets the promotion's result.
  void Promote(const std::string& task, const std::string& primary, const std::string& backup,
               const std::string& backup_id, std::function<void(absl::Status)> done);
  // Calls `fn` once everything posted for `task` so far has run (both its queues), on an
  // executor's thread.
  void AfterTask(const std::string& task, std::function<void()> fn);
  // Deletes the task from the store (TaskStore::DeleteTask), then its checkpoints' files, and
  // forgets what the runner kept about it (its queues are freed once the last call on them has
  // returned). For a task that ended, after AfterTask: nothing of it may be posted afterwards.
  absl::Status ForgetTask(const std::string& task);
  // Forgets what the runner keeps about `task` (its queues once the last call on them has
  // returned, its open tree round), for a task this coordinator no longer serves; the store keeps
  // it. After AfterTask: nothing of it may be posted afterwards.
  void DropTask(const std::string& task);
  // Blocks until every queue is idle.
  void Drain();

 private:
  struct Queues {
    std::shared_ptr<SerialQueue> calls;
    std::shared_ptr<SerialQueue> transfers;
    // Nothing posted to either is queued or running, and nothing but the runner holds them.
    bool Unused() const;
  };
  Queues QueuesOf(const std::string& task);
  // Frees the retired queues that are unused, and sets the metric.
  void FreeRetired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkResult Execute(const std::string& task, const AggregatorTree& tree,
                     const AggregatorWork& work);
  // A hierarchical task's rounds (aggregator_tree_work.cc).
  // With secure aggregation, `open` loses the peers that sit the round out and `secure_groups`
  // gets each cluster's peers (SplitSecureGroups).
  absl::Status OpenTree(const std::string& task, const AggregatorTree& tree,
                        aggregator::v1::OpenRoundRequest& open,
                        std::vector<std::vector<std::string>>& secure_groups);
  absl::StatusOr<aggregator::v1::CloseRoundResponse> CloseTree(
      const std::string& task, const AggregatorTree& tree,
      const aggregator::v1::CloseRoundRequest& close);
  // A federated-async task's buffers on its tree: every node that has peers below it, from the
  // root down, each with buffer_size = min(the task's, the peers below it).
  absl::Status OpenBufferTree(const std::string& task, const AggregatorTree& tree,
                              const aggregator::v1::OpenBufferRequest& open,
                              const std::vector<std::string>& peers);
  // The root's backup takes over the task's open round from the lost root (see Promote).
  absl::Status PromoteRoot(const std::string& task, const std::string& primary,
                           const std::string& backup, const std::string& backup_id);
  using Opens = std::vector<std::pair<std::string, aggregator::v1::OpenRoundRequest>>;
  // A promotion's backups left: each of `backups` that holds a standby round in `standbys`
  // becomes a standby of `backup_id` (below `parent`'s address when it is not empty), and
  // `open`, the promoted round, copies to them. Returns their new opens, to send with
  // OpenStandbys once mu_ is released.
  static Opens Restandby(const std::vector<std::string>& backups, const std::string& backup_id,
                         const std::string& parent,
                         std::map<std::string, aggregator::v1::OpenRoundRequest>& standbys,
                         aggregator::v1::OpenRoundRequest& open);
  // Opens each of `standbys` (a failure is logged: that backup takes no copies).
  void OpenStandbys(const std::string& task, const std::string& primary, const Opens& standbys,
                    absl::Duration timeout);
  // Every node below the root fetches `version` from its parent, from the top down, and the
  // root's backups from the root; a node that cannot is logged (it fetches the version with its
  // next round or pull).
  void PullTree(const std::string& task, const AggregatorTree& tree, uint64_t version);
  // Asks the aggregator at `address` to fetch `version` from `parent` as its child `child`.
  absl::StatusOr<bool> PullFrom(const std::string& task, uint64_t version,
                                const std::string& address, const std::string& parent,
                                const std::string& child);
  // Pulls model `version` of `task` from the aggregator at `address` into a checkpoint file and
  // stores its record (as the checkpoint of `round`). With `digest` (not 0), a model with another
  // digest is refused (FAILED_PRECONDITION) and nothing is stored.
  absl::StatusOr<StoredCheckpoint> Checkpoint(const std::string& task, const std::string& address,
                                              uint64_t version, uint64_t round, uint64_t digest);
  // The kRestore; sets `last_used` (WorkResult::last_used) whatever it returns.
  absl::StatusOr<StoredCheckpoint> Restore(const std::string& task, const std::string& address,
                                           const AggregatorWork& work, uint64_t& last_used);
  // Forgets the checkpoints of `task` before its newest options_.keep_checkpoints (a failure is
  // logged: the next checkpoint tries again).
  void PruneCheckpoints(const std::string& task);
  // Deletes the files of `gone` that are this coordinator's files of the task (named after it in
  // checkpoint_dir) and that no record of `kept` names.
  void DeleteCheckpointFiles(const std::string& task, const std::vector<StoredCheckpoint>& gone,
                             const std::vector<StoredCheckpoint>& kept);

  aggregator::AggregatorClient& client_;
  TaskStore& store_;
  Executor& calls_;
  Executor& transfers_;
  const Clock& clock_;
  CoordinatorMetrics& metrics_;
  const AggregatorWorkOptions options_;

  absl::Mutex mu_;
  std::map<std::string, Queues> queues_ ABSL_GUARDED_BY(mu_);
  // The queues of tasks dropped (deleted, handed over), until their last calls return.
  std::vector<Queues> retired_ ABSL_GUARDED_BY(mu_);
  // Per hierarchical task, its open round: the nodes below the root it was opened on, parents
  // first (CloseTree closes them, deepest first), and the standby rounds opened at their
  // backups (by address; until the round closes, for Promote).
  struct TreeRound {
    uint64_t round = 0;
    std::string root;  // its address
    std::vector<AggregatorTree::Node> nodes;
    std::vector<aggregator::v1::OpenRoundRequest> opens;  // what each of `nodes` was opened with
    std::map<std::string, aggregator::v1::OpenRoundRequest> standbys;
    std::set<std::string> root_standbys;  // those of `standbys` at the root's backups
    // Nodes not told yet that the root changed (PromoteRoot's open failed): CloseTree tells them.
    std::map<std::string, aggregator::v1::OpenRoundRequest> retell;
    bool closed = false;  // CloseTree succeeded
  };
  std::map<std::string, TreeRound> tree_rounds_ ABSL_GUARDED_BY(mu_);
  // Per task, where the values start in its checkpoint files (the layout's header size).
  std::map<std::string, uint64_t> values_offsets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator
