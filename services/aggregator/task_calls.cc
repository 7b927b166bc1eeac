#include "services/aggregator/task_calls.h"

namespace shoal::aggregator {

void TaskCalls::Record(const std::string& task) {
  absl::MutexLock lock(&mu_);
  last_[task] = ++count_;
}

TaskCalls::Held TaskCalls::Snapshot() const {
  absl::MutexLock lock(&mu_);
  Held held;
  held.as_of = count_;
  held.names.reserve(last_.size());
  for (const auto& [task, call] : last_) held.names.push_back(task);
  return held;
}

void TaskCalls::Forget(const std::string& task, absl::FunctionRef<void()> forget) {
  absl::MutexLock lock(&mu_);
  last_.erase(task);
  forget();
}

bool TaskCalls::ForgetUnlessCalledSince(const std::string& task, uint64_t as_of,
                                        absl::FunctionRef<void()> forget) {
  absl::MutexLock lock(&mu_);
  auto it = last_.find(task);
  if (it == last_.end() || it->second > as_of) return false;
  last_.erase(it);
  forget();
  return true;
}

}  // namespace shoal::aggregator
