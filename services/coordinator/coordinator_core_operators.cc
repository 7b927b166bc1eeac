// CoordinatorCore: the operators' calls (ControlService): creating, listing, stopping, deleting
// and watching tasks; and the deletion of ended tasks past --keep-ended-tasks.

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/task/task_file.h"
#include "services/coordinator/coordinator_core.h"
#include "services/coordinator/task_names.h"

namespace shoal::coordinator {
namespace {

absl::Status NoTaskNamed(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("no task named \"", name, "\""));
}

}  // namespace

absl::StatusOr<v1::TaskStatus> CoordinatorCore::CreateTask(const common::v1::TaskSpec& spec) {
  SHOAL_RETURN_IF_ERROR(task::ValidateTaskSpec(spec));
  v1::TaskStatus status;
  *status.mutable_spec() = spec;
  status.set_state(v1::TASK_STATE_WAITING);
  status.set_created_unix_ms(absl::ToUnixMillis(clock_.Now()));
  status.set_message("waiting for peers");
  std::unique_ptr<ModeTask> mode = MakeModeTask(status, options_.mode, metrics_);
  if (mode == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("mode: ", ModeName(spec.mode()), " is not supported by this coordinator yet"));
  }
  if (placement_ != nullptr) {
    bool here;
    {
      absl::MutexLock lock(&mu_);
      here = tasks_.count(spec.name()) > 0;
    }
    if (!here) {
      SHOAL_ASSIGN_OR_RETURN(bool mine, placement_->Claim(status));
      if (!mine) {
        status.set_message(
            "created for another coordinator: the least loaded one (its open tasks and their "
            "peers) takes it within a second");
        status.mutable_spec()->clear_join_token();
        return status;
      }
    }
  }
  Outbox out;
  v1::TaskStatus result;
  {
    InputLock lock(*this, out);
    if (deleting_.count(spec.name()) > 0) {
      return absl::UnavailableError(
          absl::StrCat("task \"", spec.name(), "\" is being deleted; create it again in a moment"));
    }
    auto it = tasks_.find(spec.name());
    if (it != tasks_.end()) {
      if (it->second.status.spec().SerializeAsString() != spec.SerializeAsString()) {
        return absl::AlreadyExistsError(
            absl::StrCat("a task named \"", spec.name(), "\" exists with a different spec"));
      }
      return StatusOf(it->second);
    }
    Task& task = tasks_[spec.name()];
    task_order_.push_back(spec.name());
    deleted_.erase(spec.name());
    task.status = std::move(status);
    task.mode = std::move(mode);
    if (task.UsesAggregator()) task.waiting_for_aggregator_since = clock_.Now();
    LogInfo("task ", spec.name(), " created: ", spec.rounds(), " rounds of ", spec.round_batches(),
            " batches, min ", spec.min_participants(), " peers");
    MarkChanged(task, out);
    Reconcile(out);
    result = StatusOf(task);
  }
  Flush();
  return result;
}

std::vector<v1::TaskStatus> CoordinatorCore::ListTasks() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::TaskStatus> out;
  for (const std::string& name : task_order_) {
    v1::TaskStatus status = StatusOf(tasks_.at(name));
    status.clear_history();
    out.push_back(std::move(status));
  }
  if (placement_ != nullptr) {
    for (v1::TaskStatus& status : placement_->OthersTasks()) out.push_back(std::move(status));
  }
  return out;
}

absl::StatusOr<v1::TaskStatus> CoordinatorCore::GetTaskStatus(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(name);
  if (it == tasks_.end()) return NoTaskNamed(name);
  return StatusOf(it->second);
}

absl::Status CoordinatorCore::CheckTaskExists(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return tasks_.count(name) == 0 ? NoTaskNamed(name) : absl::OkStatus();
}

absl::StatusOr<v1::TaskStatus> CoordinatorCore::StopTask(const std::string& name) {
  Outbox out;
  v1::TaskStatus result;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return NoTaskNamed(name);
    if (IsActive(it->second)) {
      Finish(it->second, v1::TASK_STATE_STOPPED, "stopped by operator", out);
    }
    Reconcile(out);
    result = StatusOf(it->second);
  }
  Flush();
  return result;
}

absl::Status CoordinatorCore::DeleteTask(const std::string& name,
                                         std::function<void(const absl::Status&)> done) {
  Outbox out;
  {
    InputLock lock(*this, out);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return NoTaskNamed(name);
    if (IsActive(it->second)) {
      return absl::FailedPreconditionError(
          absl::StrCat("task \"", name, "\" is ", StateName(it->second.status.state()),
                       "; stop it first (StopTask; shoalctl task stop ", name, ")"));
    }
    LogInfo("task ", name, " deleted by operator");
    DeleteEnded(name, "operator", std::move(done), out);
    Reconcile(out);
  }
  Flush();
  return absl::OkStatus();
}

void CoordinatorCore::DeleteExpiredTasks(Outbox& out) {
  const absl::Time now = clock_.Now();
  for (auto it = deleted_.begin(); it != deleted_.end();) {
    it = now - it->second >= kReleaseDeleted ? deleted_.erase(it) : std::next(it);
  }
  const absl::Duration keep = options_.keep_ended_tasks;
  if (keep <= absl::ZeroDuration() || fenced_) return;
  std::vector<std::string> expired;
  for (const auto& [name, task] : tasks_) {
    if (IsActive(task)) continue;
    const absl::Duration ago = now - absl::FromUnixMillis(task.status.ended_unix_ms());
    if (ago >= keep) {
      LogInfo("task ", name, " deleted: it ended ",
              absl::FormatDuration(absl::Trunc(ago, absl::Seconds(1))), " ago (--keep-ended-tasks ",
              absl::FormatDuration(keep), ")");
      expired.push_back(name);
    }
  }
  for (const std::string& name : expired) DeleteEnded(name, "retention", nullptr, out);
}

void CoordinatorCore::DeleteEnded(const std::string& name, const char* by,
                                  std::function<void(const absl::Status&)> done, Outbox& out) {
  EndWatches(name, absl::NotFoundError(absl::StrCat("task \"", name, "\" was deleted")), out);
  tasks_.erase(name);
  task_order_.erase(std::find(task_order_.begin(), task_order_.end(), name));
  deleting_.insert(name);
  deleted_[name] = clock_.Now();
  metrics_.tasks_deleted.Add({{"by", by}}).Increment();
  // Behind the task's aggregator work (a checkpoint of its last version may be on its way to
  // the store) and every store write decided so far.
  out.push_back([this, name, done = std::move(done)]() mutable {
    work_.AfterTask(name, [this, name, done = std::move(done)]() mutable {
      store_writes_.Post([this, name, done = std::move(done)] {
        absl::Status deleted = work_.ForgetTask(name);
        CheckStoreWrite(deleted, name, "its deletion");
        if (deleted.ok() && placement_ != nullptr) {
          if (absl::Status released = placement_->Release(name); !released.ok()) {
            LogWarning("task ", name,
                       ": deleted, but its owner key stays until this "
                       "coordinator's lease ends: ",
                       released.message());
          }
        }
        // A delete the store refused (not fenced): the task is served again as it is stored,
        // for the next try (the operator's, or the retention's a second later).
        std::optional<StoredTask> kept;
        if (!deleted.ok() && !absl::IsFailedPrecondition(deleted)) {
          absl::StatusOr<StoredTask> stored = store_.LoadTask(name, options_.history_in_memory);
          if (stored.ok()) kept = *std::move(stored);
        }
        {
          absl::MutexLock lock(&mu_);
          deleting_.erase(name);
          if (kept.has_value() && tasks_.count(name) == 0 && !stopping_) {
            RestoreTask(*std::move(kept), "");
          }
        }
        if (done) done(deleted);
      });
    });
  });
}

absl::StatusOr<uint64_t> CoordinatorCore::Watch(const std::string& name, StatusCallback callback,
                                                WatchEndCallback ended) {
  uint64_t handle;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(name);
    if (it == tasks_.end()) return NoTaskNamed(name);
    handle = next_watch_++;
    watchers_[handle] = {name, callback, std::move(ended)};
    // Through the effects queue, so that no older status can overtake this one.
    effects_.emplace_back([callback, status = StatusOf(it->second)] { callback(status); });
  }
  Flush();
  return handle;
}

void CoordinatorCore::Unwatch(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(handle);
}

}  // namespace shoal::coordinator
