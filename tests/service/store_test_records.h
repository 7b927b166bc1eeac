#pragma once

// Records and options the coordinator store's tests share (coordinator_store_test.cc and
// coordinator_store_etcd_test.cc).

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/coordinator/task_store.h"

namespace shoal::coordinator::store_testing {

// A task with a history and participants, which the stores leave out (they have their own
// records).
inline v1::TaskStatus Task(const std::string& name, v1::TaskState state) {
  v1::TaskStatus status;
  status.mutable_spec()->set_name(name);
  status.mutable_spec()->set_rounds(20);
  status.set_state(state);
  status.set_round(3);
  status.add_history()->set_round(1);  // not stored: rounds have their own records
  status.add_participants("peer-1");
  return status;
}

inline v1::RoundSummary Round(uint64_t n, const std::string& note = "") {
  v1::RoundSummary round;
  round.set_round(n);
  round.set_model_version(n);
  round.set_note(note.empty() ? absl::StrCat("round ", n) : note);
  return round;
}

inline StoreOptions Options(const std::string& store, const std::string& state_dir) {
  StoreOptions options;
  options.store = store;
  options.state_dir = state_dir;
  options.lease_ttl = absl::Seconds(2);
  return options;
}

}  // namespace shoal::coordinator::store_testing
