#include "services/coordinator/store/task_ownership.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/log.h"
#include "services/coordinator/served_by.h"

namespace shoal::coordinator {
namespace {

// A second of scans: after it, any coordinator takes an orphan, not only the least loaded.
constexpr int kOrphanScansBeforeAnyTakes = 4;

bool Open(const v1::TaskStatus& status) {
  return status.state() == v1::TASK_STATE_WAITING || status.state() == v1::TASK_STATE_RUNNING;
}

// What a task adds to its coordinator's load: an open one one for itself and one per peer in it
// (its data reports: the peers present when it was stored last); a closed one nothing.
size_t Weight(const v1::TaskStatus& status) {
  return Open(status) ? 1 + static_cast<size_t>(status.data_size()) : 0;
}

}  // namespace

TaskOwnership::TaskOwnership(etcd::EtcdKv& kv, TaskOwnershipOptions options)
    : kv_(kv), options_(std::move(options)) {}

TaskOwnership::~TaskOwnership() { Stop(); }

std::string TaskOwnership::OwnerKey(const std::string& prefix, const std::string& task) {
  return absl::StrCat(prefix, "/owners/", task);
}

std::string TaskOwnership::MemberKey(const std::string& prefix, const std::string& address) {
  return absl::StrCat(prefix, "/coordinators/", address);
}

void TaskOwnership::Start(std::function<void(const std::string& task)> adopt,
                          std::function<void(const std::string& task)> hand_off) {
  adopt_ = std::move(adopt);
  hand_off_ = std::move(hand_off);
  scanner_ = std::thread([this] { ScanLoop(); });
}

void TaskOwnership::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (scanner_.joinable()) scanner_.join();
}

void TaskOwnership::ScanLoop() {
  absl::Status last = absl::OkStatus();
  while (true) {
    absl::StatusOr<std::vector<std::string>> taken = ScanOnce();
    if (taken.ok()) {
      for (const std::string& task : *taken) {
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;
        }
        adopt_(task);
      }
      if (std::optional<std::string> task = TakeHandOff()) {
        LogInfo("task ", *task, ": handing it over (this coordinator's load, its open tasks and ",
                "their peers, has been at least twice the task's above another's for ",
                options_.hand_off_after, " scans)");
        hand_off_(*task);
      }
    } else if (taken.status() != last) {
      LogWarning("cannot read the tasks' owners from etcd: ", taken.status().ToString(),
                 " (retrying)");
    }
    last = taken.status();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.scan)) return;
  }
}

absl::StatusOr<std::vector<std::string>> TaskOwnership::Read() {
  const std::string members_prefix = MemberKey(options_.prefix, "");
  const std::string owners_prefix = OwnerKey(options_.prefix, "");
  const std::string tasks_prefix = absl::StrCat(options_.prefix, "/tasks/");
  absl::StatusOr<std::vector<etcd::KeyValue>> members =
      kv_.Range({members_prefix, etcd::EtcdKv::PrefixEnd(members_prefix)});
  if (!members.ok()) return members.status();
  absl::StatusOr<std::vector<etcd::KeyValue>> owners =
      kv_.Range({owners_prefix, etcd::EtcdKv::PrefixEnd(owners_prefix)});
  if (!owners.ok()) return owners.status();
  absl::StatusOr<std::vector<etcd::KeyValue>> tasks =
      kv_.Range({tasks_prefix, etcd::EtcdKv::PrefixEnd(tasks_prefix)});
  if (!tasks.ok()) return tasks.status();

  std::set<std::string> live;
  for (const etcd::KeyValue& kv : *members) live.insert(kv.key.substr(members_prefix.size()));
  std::map<std::string, Owner> owner_of;
  for (const etcd::KeyValue& kv : *owners) {
    owner_of[kv.key.substr(owners_prefix.size())] = {kv.value, kv.lease};
  }
  std::map<std::string, v1::TaskStatus> statuses;
  std::vector<std::string> orphans;
  for (const etcd::KeyValue& kv : *tasks) {
    const std::string name = kv.key.substr(tasks_prefix.size());
    v1::TaskStatus status;
    if (!status.ParseFromString(kv.value)) {
      LogWarning("etcd: the task record ", kv.key, " does not parse; skipped");
      continue;
    }
    statuses[name] = std::move(status);
    if (owner_of.count(name) == 0) orphans.push_back(name);
  }
  absl::MutexLock lock(&mu_);
  tasks_ = std::move(statuses);
  owners_ = std::move(owner_of);
  members_ = std::move(live);
  return orphans;
}

std::map<std::string, std::string> TaskOwnership::Assign(const std::vector<std::string>& orphans,
                                                         std::map<std::string, size_t>& load) {
  std::map<std::string, std::string> to;
  for (const std::string& task : orphans) {
    // Every coordinator reads the same keys and picks the same one: the least loaded.
    const std::string least = LeastLoaded(load);
    if (least.empty()) break;  // not even this one is a member (its lease lapsed)
    to[task] = least;
    auto status = tasks_.find(task);
    load[least] += status != tasks_.end() ? std::max<size_t>(1, Weight(status->second)) : 1;
  }
  return to;
}

absl::StatusOr<std::vector<std::string>> TaskOwnership::ScanOnce() {
  absl::StatusOr<std::vector<std::string>> orphans = Read();
  if (!orphans.ok()) return orphans.status();
  std::vector<std::string> take;
  {
    absl::MutexLock lock(&mu_);
    std::map<std::string, int> scans;
    for (const std::string& task : *orphans) scans[task] = orphan_scans_[task] + 1;
    orphan_scans_ = std::move(scans);
    std::map<std::string, size_t> load = Load();
    if (orphans->empty()) {
      WeighHandOff(load);
    } else {
      imbalanced_scans_ = 0;  // a task is on its way somewhere: weigh again once it arrived
    }
    for (const auto& [task, to] : Assign(*orphans, load)) {
      if (to == options_.advertise || orphan_scans_[task] >= kOrphanScansBeforeAnyTakes) {
        take.push_back(task);
      }
    }
  }
  std::vector<std::string> taken;
  for (const std::string& task : take) {
    absl::StatusOr<bool> held = TakeOwnerKey(task, /*task_must_be_new=*/false);
    if (!held.ok()) return held.status();
    if (!*held) continue;
    taken.push_back(task);
    absl::MutexLock lock(&mu_);
    owners_[task] = {options_.advertise, options_.lease};  // this one's now, as Claim's
  }
  return taken;
}

void TaskOwnership::WeighHandOff(const std::map<std::string, size_t>& load) {
  auto mine = load.find(options_.advertise);
  const std::string least = LeastLoaded(load);
  // A task of weight w narrows the gap when it moves only if 2w <= gap.
  const size_t gap = mine == load.end() || least.empty() || mine->second < load.at(least)
                         ? 0
                         : mine->second - load.at(least);
  const v1::TaskStatus* pick = nullptr;
  if (gap >= 2) {
    // Of the tasks light enough, a waiting one before a running one (nobody has worked on it
    // yet), the newest first.
    auto rank = [](const v1::TaskStatus& s) {
      return std::make_pair(s.state() == v1::TASK_STATE_WAITING, s.created_unix_ms());
    };
    for (const auto& [name, owner] : owners_) {
      if (owner.address != options_.advertise) continue;
      auto task = tasks_.find(name);
      if (task == tasks_.end() || !Open(task->second) || 2 * Weight(task->second) > gap) continue;
      if (pick == nullptr || rank(task->second) > rank(*pick)) pick = &task->second;
    }
  }
  if (pick == nullptr) {
    imbalanced_scans_ = 0;
    return;
  }
  if (++imbalanced_scans_ < options_.hand_off_after) return;
  imbalanced_scans_ = 0;
  hand_off_task_ = pick->spec().name();
}

std::optional<std::string> TaskOwnership::TakeHandOff() {
  absl::MutexLock lock(&mu_);
  std::optional<std::string> task = std::move(hand_off_task_);
  hand_off_task_.reset();
  return task;
}

absl::Status TaskOwnership::Release(const std::string& task) {
  const std::string owner_key = OwnerKey(options_.prefix, task);
  const etcd::Fence fence{owner_key, options_.lease};
  absl::Status deleted = kv_.DeleteRange(owner_key, owner_key + '\0', &fence);
  // Not held under this lease (any more): nothing to give up.
  if (absl::IsFailedPrecondition(deleted)) return absl::OkStatus();
  if (!deleted.ok()) return deleted;
  absl::MutexLock lock(&mu_);
  auto owner = owners_.find(task);
  if (owner != owners_.end() && owner->second.address == options_.advertise) owners_.erase(owner);
  return absl::OkStatus();
}

std::string TaskOwnership::LeastLoaded(const std::map<std::string, size_t>& load) {
  std::string least;
  size_t fewest = 0;
  for (const auto& [address, count] : load) {
    if (least.empty() || count < fewest) {
      least = address;
      fewest = count;
    }
  }
  return least;
}

std::map<std::string, size_t> TaskOwnership::Load() const {
  std::map<std::string, size_t> load;
  for (const std::string& address : members_) load[address] = 0;
  for (const auto& [name, owner] : owners_) {
    auto it = load.find(owner.address);
    auto task = tasks_.find(name);
    if (it != load.end() && task != tasks_.end()) it->second += Weight(task->second);
  }
  return load;
}

absl::StatusOr<bool> TaskOwnership::TakeOwnerKey(const std::string& task, bool task_must_be_new) {
  const std::string owner_key = OwnerKey(options_.prefix, task);
  std::vector<std::string> absent = {owner_key};
  if (task_must_be_new) absent.push_back(absl::StrCat(options_.prefix, "/tasks/", task));
  absl::StatusOr<bool> put =
      kv_.PutIfNoneExist(absent, owner_key, options_.advertise, options_.lease);
  if (!put.ok() || *put) return put;
  // Held already: by this coordinator (an earlier claim) or another.
  absl::StatusOr<std::vector<etcd::KeyValue>> held = kv_.Range({owner_key, owner_key + '\0'});
  if (!held.ok()) return held.status();
  const bool mine = !held->empty() && held->front().value == options_.advertise &&
                    held->front().lease == options_.lease;
  if (mine) return true;
  absl::MutexLock lock(&mu_);
  if (held->empty()) {
    owners_.erase(task);
  } else {
    owners_[task] = {held->front().value, held->front().lease};
  }
  return false;
}

absl::Status TaskOwnership::Elsewhere(const std::string& task) {
  const std::string owner_key = OwnerKey(options_.prefix, task);
  absl::StatusOr<std::vector<etcd::KeyValue>> owner = kv_.Range({owner_key, owner_key + '\0'});
  if (!owner.ok()) return owner.status();
  if (!owner->empty() && owner->front().value != options_.advertise) {
    return ServedByError(task, owner->front().value);
  }
  const std::string task_key = absl::StrCat(options_.prefix, "/tasks/", task);
  absl::StatusOr<std::vector<etcd::KeyValue>> stored = kv_.Range({task_key, task_key + '\0'});
  if (!stored.ok()) return stored.status();
  if (stored->empty() && owner->empty()) {
    return absl::NotFoundError(absl::StrCat("no task named \"", task, "\""));
  }
  // Stored without a live owner (its coordinator died), or taken here a moment ago.
  return absl::UnavailableError(absl::StrCat(
      "task \"", task, "\" is being taken over by a coordinator; try again in a moment"));
}

absl::StatusOr<bool> TaskOwnership::Claim(const v1::TaskStatus& initial) {
  const std::string& task = initial.spec().name();
  // Read afresh (a creation is rare): the coordinators and their load as they are now, the
  // tasks waiting for an owner counted where the scans will put them.
  absl::StatusOr<std::vector<std::string>> orphans = Read();
  if (!orphans.ok()) return orphans.status();
  std::string least;
  {
    absl::MutexLock lock(&mu_);
    std::map<std::string, size_t> load = Load();
    Assign(*orphans, load);
    least = LeastLoaded(load);
  }
  if (least.empty() || least == options_.advertise) {
    absl::StatusOr<bool> held = TakeOwnerKey(task, /*task_must_be_new=*/true);
    if (!held.ok()) return held;
    if (*held) {
      // Counted at once: the next task created here before a scan sees this one's load.
      absl::MutexLock lock(&mu_);
      tasks_[task] = initial;
      owners_[task] = {options_.advertise, options_.lease};
      return true;
    }
  } else {
    // For the scans to place: the task's record without an owner.
    const std::string task_key = absl::StrCat(options_.prefix, "/tasks/", task);
    absl::StatusOr<bool> stored = kv_.PutIfNoneExist({task_key, OwnerKey(options_.prefix, task)},
                                                     task_key, initial.SerializeAsString(), 0);
    if (!stored.ok()) return stored.status();
    if (*stored) {
      LogInfo("task ", task, " created for another coordinator (", least,
              " is the least loaded: its open tasks and their peers)");
      return false;
    }
  }
  absl::Status elsewhere = Elsewhere(task);
  // NOT_FOUND: the owner key went between the two reads; the caller tries again.
  return elsewhere.ok() || absl::IsNotFound(elsewhere)
             ? absl::UnavailableError(absl::StrCat("task \"", task, "\" changed meanwhile"))
             : elsewhere;
}

std::vector<v1::TaskStatus> TaskOwnership::OthersTasks() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TaskStatus> out;
  for (const auto& [name, status] : tasks_) {
    auto owner = owners_.find(name);
    if (owner != owners_.end() && owner->second.address == options_.advertise) continue;
    v1::TaskStatus copy = status;
    copy.mutable_spec()->clear_join_token();
    if (owner == owners_.end() && Open(copy)) {
      copy.set_message("being taken over by a coordinator");
    }
    out.push_back(std::move(copy));
  }
  std::sort(out.begin(), out.end(), [](const v1::TaskStatus& a, const v1::TaskStatus& b) {
    return a.created_unix_ms() < b.created_unix_ms();
  });
  return out;
}

std::map<std::string, size_t> TaskOwnership::OthersAggregatorLoad() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, size_t> load;
  for (const auto& [name, status] : tasks_) {
    auto owner = owners_.find(name);
    if (owner != owners_.end() && owner->second.address == options_.advertise) continue;
    if (!Open(status)) continue;
    std::set<std::string> used;
    if (!status.aggregator().empty()) used.insert(status.aggregator());
    for (const v1::ClusterInfo& cluster : status.clusters()) {
      if (!cluster.aggregator().empty()) used.insert(cluster.aggregator());
      for (const std::string& backup : cluster.backups()) used.insert(backup);
    }
    for (const std::string& address : used) ++load[address];
  }
  return load;
}

std::optional<std::string> TaskOwnership::OpenTaskFor(const std::string& join_token, bool waiting) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, status] : tasks_) {
    auto owner = owners_.find(name);
    if (owner == owners_.end() || owner->second.address == options_.advertise ||
        members_.count(owner->second.address) == 0 || !Open(status) ||
        (waiting && status.state() != v1::TASK_STATE_WAITING)) {
      continue;
    }
    if (status.spec().join_token().empty() || status.spec().join_token() == join_token) {
      return owner->second.address;
    }
  }
  return std::nullopt;
}

}  // namespace shoal::coordinator
