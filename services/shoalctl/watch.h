#pragma once

// Internal to shoalctl_lib: following a running task, for `task watch` and `local`.

#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/shoalctl/commands.h"
#include "services/shoalctl/control_client.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::shoalctl::internal {

// Prints the live progress line: rewritten in place on a terminal; otherwise (logs, CI) a line
// only when the settled round, the state or the peers change (FormatProgressLogLine). Owned by
// the command; thread-safe (the launcher's supervisor prints notes while the main thread
// updates).
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, bool tty, int columns)
      : out_(out), tty_(tty), columns_(columns) {}

  void Update(const coordinator::v1::TaskStatus& status);
  // A line of its own above the progress line.
  void Note(const std::string& text);
  // Ends the live line.
  void Finish();

 private:
  std::ostream& out_;
  const bool tty_;
  const int columns_;
  absl::Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
};

// Watches a task until it ends, reconnecting for a while when the stream breaks. Returns the
// final status; CANCELLED when env.interrupt fired.
absl::StatusOr<coordinator::v1::TaskStatus> WatchUntilEnd(ControlClientInterface& client,
                                                          const std::string& name,
                                                          ProgressPrinter& printer,
                                                          Environment& env,
                                                          const std::string& coordinator);

}  // namespace shoal::shoalctl::internal
