#include "services/coordinator/aggregator_work.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/model_file.h"

namespace shoal::coordinator {
namespace {

using Kind = AggregatorWork::Kind;

bool IsTransfer(Kind kind) { return kind == Kind::kCheckpoint || kind == Kind::kRestore; }

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

}  // namespace

AggregatorWorkRunner::AggregatorWorkRunner(aggregator::AggregatorClient& client, TaskStore& store,
                                           Executor& calls, Executor& transfers, const Clock& clock,
                                           CoordinatorMetrics& metrics,
                                           AggregatorWorkOptions options)
    : client_(client),
      store_(store),
      calls_(calls),
      transfers_(transfers),
      clock_(clock),
      metrics_(metrics),
      options_(options) {}

AggregatorWorkRunner::~AggregatorWorkRunner() { Drain(); }

bool AggregatorWorkRunner::Queues::Unused() const {
  return calls.use_count() == 1 && transfers.use_count() == 1 && calls->idle() && transfers->idle();
}

AggregatorWorkRunner::Queues AggregatorWorkRunner::QueuesOf(const std::string& task) {
  absl::MutexLock lock(&mu_);
  Queues& q = queues_[task];
  if (q.calls == nullptr) {
    q.calls = std::make_shared<SerialQueue>(calls_);
    q.transfers = std::make_shared<SerialQueue>(transfers_);
    FreeRetired();
  } else if (!retired_.empty()) {
    FreeRetired();
  }
  return q;
}

void AggregatorWorkRunner::FreeRetired() {
  retired_.erase(
      std::remove_if(retired_.begin(), retired_.end(), [](const Queues& q) { return q.Unused(); }),
      retired_.end());
  metrics_.task_work_queues.Set(static_cast<double>(queues_.size() + retired_.size()));
}

void AggregatorWorkRunner::Run(const std::string& task, AggregatorTree tree, AggregatorWork work,
                               DoneFn done) {
  Queues q = QueuesOf(task);
  SerialQueue& queue = IsTransfer(work.kind) ? *q.transfers : *q.calls;
  queue.Post([this, task, tree = std::move(tree), work = std::move(work), done = std::move(done)] {
    done(Execute(task, tree, work));
  });
}

void AggregatorWorkRunner::SetMembers(const std::string& task, const std::string& address,
                                      aggregator::v1::SetMembersRequest request,
                                      std::function<void(absl::Status)> done) {
  request.set_task(task);
  QueuesOf(task).calls->Post([this, address, request = std::move(request), done = std::move(done)] {
    done(client_.SetMembers(address, request, clock_.Now() + options_.call_timeout));
  });
}

void AggregatorWorkRunner::Release(const std::string& task, const std::string& address) {
  QueuesOf(task).calls->Post([this, task, address] {
    absl::Status s =
        client_.ReleaseTask(address, task, clock_.Now() + options_.call_timeout).status();
    if (!s.ok()) LogWarning("task ", task, ": release at ", address, ": ", s.message());
  });
}

void AggregatorWorkRunner::Promote(const std::string& task, const std::string& primary,
                                   const std::string& backup, const std::string& backup_id,
                                   std::function<void(absl::Status)> done) {
  QueuesOf(task).calls->Post([this, task, primary, backup, backup_id, done = std::move(done)] {
    bool root = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = tree_rounds_.find(task);
      root = it != tree_rounds_.end() && it->second.root == primary;
    }
    if (root) {
      done(PromoteRoot(task, primary, backup, backup_id));
      return;
    }
    std::optional<aggregator::v1::OpenRoundRequest> open;
    Opens others;
    std::optional<uint64_t> open_round;  // the primary was in this round, still open
    {
      absl::MutexLock lock(&mu_);
      auto it = tree_rounds_.find(task);
      if (it != tree_rounds_.end()) {
        TreeRound& round = it->second;
        for (size_t k = 0; k < round.nodes.size(); ++k) {
          AggregatorTree::Node& node = round.nodes[k];
          if (node.address != primary) continue;
          if (!round.closed) open_round = round.round;
          node.address = backup;
          node.backups.erase(std::remove(node.backups.begin(), node.backups.end(), backup),
                             node.backups.end());
          if (auto standby = round.standbys.find(backup); standby != round.standbys.end()) {
            open = std::move(standby->second);
            round.standbys.erase(standby);
            others = Restandby(node.backups, backup_id, "", round.standbys, *open);
            open->clear_standby_for();
            if (!open->secure_aggregation().enabled()) open->set_replica_id(backup_id);
            round.opens[k] = *open;  // what the node holds now, should its parent change
          }
        }
      }
    }
    if (!open.has_value()) {
      // A backup without the round (its standby open failed) cannot take it over: the task
      // starts over rather than lose the updates the primary acknowledged.
      done(open_round.has_value()
               ? absl::FailedPreconditionError(
                     absl::StrCat("backup ", backup, " holds no standby of round ", *open_round))
               : absl::OkStatus());
      return;
    }
    // The other backups first: they take the new primary's copies from then on.
    OpenStandbys(task, backup, others, options_.call_timeout);
    done(client_.OpenRound(backup, *open, clock_.Now() + options_.call_timeout));
  });
}

AggregatorWorkRunner::Opens AggregatorWorkRunner::Restandby(
    const std::vector<std::string>& backups, const std::string& backup_id,
    const std::string& parent, std::map<std::string, aggregator::v1::OpenRoundRequest>& standbys,
    aggregator::v1::OpenRoundRequest& open) {
  Opens opens;
  open.clear_backups();
  for (const std::string& other : backups) {
    auto it = standbys.find(other);
    if (it == standbys.end()) continue;
    it->second.set_standby_for(backup_id);
    if (!parent.empty()) it->second.mutable_parent()->set_address(parent);
    if (!open.secure_aggregation().enabled()) open.add_backups(other);  // secure: no copies
    opens.emplace_back(other, it->second);
  }
  return opens;
}

void AggregatorWorkRunner::OpenStandbys(const std::string& task, const std::string& primary,
                                        const Opens& standbys, absl::Duration timeout) {
  for (const auto& [address, open] : standbys) {
    absl::Status s = client_.OpenRound(address, open, clock_.Now() + timeout);
    if (!s.ok()) {
      LogWarning("task ", task, ": backup ", address, " of ", primary, ": ", s.message());
    }
  }
}

void AggregatorWorkRunner::AfterTask(const std::string& task, std::function<void()> fn) {
  Queues q = QueuesOf(task);
  q.calls->Post(
      [transfers = q.transfers, fn = std::move(fn)]() mutable { transfers->Post(std::move(fn)); });
}

void AggregatorWorkRunner::Drain() {
  std::vector<std::shared_ptr<SerialQueue>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [task, q] : queues_) {
      all.push_back(q.calls);
      all.push_back(q.transfers);
    }
    for (const Queues& q : retired_) {
      all.push_back(q.calls);
      all.push_back(q.transfers);
    }
  }
  for (const std::shared_ptr<SerialQueue>& q : all) q->Drain();
  all.clear();
  absl::MutexLock lock(&mu_);
  FreeRetired();
}

WorkResult AggregatorWorkRunner::Execute(const std::string& task, const AggregatorTree& tree,
                                         const AggregatorWork& work) {
  const std::string& address = tree.root();
  WorkResult result;
  result.work = work;
  const absl::Time deadline = clock_.Now() + options_.call_timeout;
  switch (work.kind) {
    case Kind::kOpenRound: {
      result.work.open.set_task(task);
      result.status = tree.hierarchical
                          ? OpenTree(task, tree, result.work.open, result.secure_groups)
                          : client_.OpenRound(address, result.work.open, deadline);
      break;
    }
    case Kind::kCloseRound: {
      aggregator::v1::CloseRoundRequest request = work.close;
      request.set_task(task);
      absl::StatusOr<aggregator::v1::CloseRoundResponse> closed =
          tree.hierarchical ? CloseTree(task, tree, request)
                            : client_.CloseRound(address, request, deadline);
      result.status = closed.status();
      if (closed.ok()) result.closed = *std::move(closed);
      break;
    }
    case Kind::kOpenBuffer: {
      aggregator::v1::OpenBufferRequest request = work.buffer;
      request.set_task(task);
      result.status = tree.hierarchical ? OpenBufferTree(task, tree, request, work.peers)
                                        : client_.OpenBuffer(address, request, deadline);
      break;
    }
    case Kind::kPullTree:
      PullTree(task, tree, work.version);
      break;
    case Kind::kCheckpoint:
      result.status = Checkpoint(task, address, work.version, work.round, /*digest=*/0).status();
      if (!result.status.ok()) {
        metrics_.aggregator_errors.Increment();
        LogWarning("task ", task, ": checkpoint of version ", work.version,
                   " failed: ", result.status.message());
      }
      break;
    case Kind::kRestore: {
      absl::StatusOr<StoredCheckpoint> restored = Restore(task, address, work, result.last_used);
      result.status = restored.status();
      if (restored.ok()) result.restored = *std::move(restored);
      break;
    }
  }
  return result;
}

absl::StatusOr<StoredCheckpoint> AggregatorWorkRunner::Checkpoint(const std::string& task,
                                                                  const std::string& address,
                                                                  uint64_t version, uint64_t round,
                                                                  uint64_t digest) {
  // The model streams from the aggregator straight into the checkpoint's file: no model-sized
  // buffer here. A task's layout never changes, so after its first checkpoint the values land
  // where they stay and only the header is written at the end.
  uint64_t values_offset = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = values_offsets_.find(task); it != values_offsets_.end()) {
      values_offset = it->second;
    }
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<tensor::ModelFileWriter> file,
                         tensor::ModelFileWriter::Create(store_.checkpoint_dir(), values_offset));
  SHOAL_ASSIGN_OR_RETURN(
      aggregator::AggregatorClient::ModelDownload download,
      client_.GetModelInto(
          address, task, version, aggregator::Caller{}, clock_.Now() + options_.transfer_timeout,
          [&file](size_t first, absl::Span<const float> values) {
            return file->Write(first, values);
          },
          /*held=*/nullptr));
  metrics_.bytes_received.Increment(static_cast<double>(download.payload_bytes));
  if (digest != 0 && file->digest() != digest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the aggregator at ", address, " holds another model as version ", version, " (digest ",
        HexDigest(file->digest()), ", published ", HexDigest(digest), ")"));
  }
  const tensor::ModelLayout& layout = download.layout;
  StoredCheckpoint c;
  c.task = task;
  c.version = version;
  c.round = round;
  c.digest = HexDigest(file->digest());
  // Named by task and digest: records of one task that share a model share its file, and no
  // other task's record ever names it (PruneCheckpoints).
  c.path = absl::StrCat(store_.checkpoint_dir(), "/", task, "-", c.digest, ".model");
  SHOAL_RETURN_IF_ERROR(file->Commit(layout, c.path));
  {
    absl::MutexLock lock(&mu_);
    values_offsets_[task] = tensor::ModelFileValuesOffset(layout);
  }
  SHOAL_RETURN_IF_ERROR(store_.PutCheckpoint(c));
  PruneCheckpoints(task);
  return c;
}

void AggregatorWorkRunner::PruneCheckpoints(const std::string& task) {
  const size_t keep = options_.keep_checkpoints;
  if (keep == 0) return;
  absl::StatusOr<std::vector<StoredCheckpoint>> all = store_.ListCheckpoints(task);
  if (!all.ok()) {
    LogWarning("task ", task, ": cannot list its checkpoints: ", all.status().message());
    return;
  }
  if (all->size() <= keep) return;
  const size_t first_kept = all->size() - keep;
  // The records go first: a file is deleted only once nothing names it.
  if (absl::Status s = store_.DeleteCheckpointsBefore(task, (*all)[first_kept].version); !s.ok()) {
    LogWarning("task ", task, ": cannot forget its old checkpoints: ", s.message());
    return;
  }
  DeleteCheckpointFiles(task, {all->begin(), all->begin() + first_kept},
                        {all->begin() + first_kept, all->end()});
}

void AggregatorWorkRunner::DeleteCheckpointFiles(const std::string& task,
                                                 const std::vector<StoredCheckpoint>& gone,
                                                 const std::vector<StoredCheckpoint>& kept) {
  std::set<std::string> named;
  for (const StoredCheckpoint& c : kept) named.insert(c.path);
  const std::string own = absl::StrCat(store_.checkpoint_dir(), "/", task, "-");
  for (const StoredCheckpoint& c : gone) {
    // Only this coordinator's own files of the task (a file named by digest alone may be
    // another task's too).
    if (named.count(c.path) > 0 || !absl::StartsWith(c.path, own)) continue;
    named.insert(c.path);
    if (::unlink(c.path.c_str()) != 0 && errno != ENOENT) {
      LogWarning("task ", task, ": cannot delete the checkpoint file ", c.path, ": ",
                 std::strerror(errno));
    }
  }
}

absl::Status AggregatorWorkRunner::ForgetTask(const std::string& task) {
  absl::StatusOr<std::vector<StoredCheckpoint>> all = store_.ListCheckpoints(task);
  if (!all.ok()) return all.status();
  // The records go first: a file is deleted only once nothing names it.
  SHOAL_RETURN_IF_ERROR(store_.DeleteTask(task));
  DeleteCheckpointFiles(task, *all, {});
  DropTask(task);
  return absl::OkStatus();
}

void AggregatorWorkRunner::DropTask(const std::string& task) {
  absl::MutexLock lock(&mu_);
  tree_rounds_.erase(task);
  values_offsets_.erase(task);
  if (auto it = queues_.find(task); it != queues_.end()) {
    retired_.push_back(std::move(it->second));
    queues_.erase(it);
  }
  FreeRetired();
}

absl::StatusOr<StoredCheckpoint> AggregatorWorkRunner::Restore(const std::string& task,
                                                               const std::string& address,
                                                               const AggregatorWork& work,
                                                               uint64_t& last_used) {
  last_used = std::max(work.version, work.last_used);
  absl::StatusOr<StoredCheckpoint> c = store_.GetCheckpoint(task, std::nullopt);
  if (!c.ok() && !absl::IsNotFound(c.status())) return c.status();
  // Sent from the file's pages (mapped and checked as ReadModelFile checks a file), not from a
  // model-sized copy in the heap.
  absl::StatusOr<std::shared_ptr<const tensor::MappedModelFile>> file =
      absl::NotFoundError("no checkpoint");
  if (c.ok()) file = tensor::MappedModelFile::Open(c->path);
  // The newest version published is stored as a round before any peer hears of it, but its
  // checkpoint comes after: when the checkpoint is older (its writer stopped in between) or its
  // file cannot be read here (another coordinator's state directory), the version is taken from
  // an aggregator that still holds it, before anything is reset there.
  if (work.version > 0 && (!c.ok() || c->version < work.version || !file.ok())) {
    for (const std::string& holder : work.holders) {
      absl::StatusOr<StoredCheckpoint> pulled =
          Checkpoint(task, holder, work.version, work.round, work.digest);
      if (!pulled.ok()) {
        LogWarning("task ", task, ": model version ", work.version, " is not at ", holder, ": ",
                   pulled.status().message());
        continue;
      }
      LogInfo("task ", task, ": model version ", work.version, " checkpointed from ", holder);
      c = *std::move(pulled);
      file = tensor::MappedModelFile::Open(c->path);
      break;
    }
  }
  // The task starts over at this aggregator: whatever it kept of the task (a version newer than
  // the one published, when the coordinator stopped before storing its round; rounds of an
  // earlier tree, when the tree was rebuilt or moved) is forgotten first, and what comes next is
  // numbered after the newest version it held: a peer may have fetched that one, and must not
  // take another model for it. The core sends the members again after every restore.
  absl::StatusOr<std::optional<uint64_t>> released =
      client_.ReleaseTask(address, task, clock_.Now() + options_.call_timeout);
  if (!released.ok() && !absl::IsNotFound(released.status())) return released.status();
  if (released.ok() && released->has_value() && **released > last_used) {
    LogWarning("task ", task, ": the aggregator at ", address, " held model version ", **released,
               ", newer than the last one recorded (", last_used,
               "); the task's next version is numbered after it");
    last_used = **released;
  }
  if (!c.ok()) return c.status();  // NOT_FOUND: no checkpoint, no version held anywhere
  if (!file.ok()) {
    // NOT_FOUND is reserved for "no checkpoint": a missing file is lost data.
    return absl::DataLossError(
        absl::StrCat("checkpoint of version ", c->version, ": ", file.status().message()));
  }
  if (c->version < last_used) {
    // The versions after the checkpoint are lost. Peers may hold them: the checkpoint's model
    // comes back under a number after every one used, so that no version number ever names two
    // models (a peer holding the old one would not download the new one).
    const uint64_t renumbered = last_used + 1;
    const std::string lost =
        c->version + 1 == last_used
            ? absl::StrCat("model version ", last_used, " is")
            : absl::StrCat("model versions ", c->version + 1, " to ", last_used, " are");
    LogWarning("task ", task, ": ", lost, " lost; the checkpoint of version ", c->version,
               " (round ", c->round, ") comes back as version ", renumbered);
    c->version = renumbered;
    SHOAL_RETURN_IF_ERROR(store_.PutCheckpoint(*c));
  }
  const common::v1::ModelMeta meta = tensor::MakeModelMeta(task, c->version, (*file)->layout());
  std::shared_ptr<const tensor::EncodedModel> model = tensor::EncodeRaw(*std::move(file));
  SHOAL_RETURN_IF_ERROR(client_
                            .PutModel(address, meta, model, aggregator::Caller{},
                                      clock_.Now() + options_.transfer_timeout)
                            .status());
  metrics_.bytes_sent.Increment(static_cast<double>(model->payload_bytes()));
  return *std::move(c);
}

}  // namespace shoal::coordinator
