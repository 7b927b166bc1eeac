#pragma once

// How shoalctl shows tasks: JSON for scripts, tables and a live progress line for people.
// Pure functions of TaskStatus (tested without a server).

#include <string>
#include <vector>

#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::shoalctl {

// True for completed, stopped and failed.
bool IsTerminal(coordinator::v1::TaskState state);

// "running", "federated-sync", "training".
std::string StateName(coordinator::v1::TaskState state);
std::string PhaseName(coordinator::v1::RoundPhase phase);
std::string ModeName(common::v1::Mode mode);

// One JSON object on one line, for `task status --json`. Top-level keys: name, mode, state,
// phase, round, rounds, participants (peer ids), model_version, aggregator, message,
// created_unix_ms, last_test_accuracy (null before the first evaluation), privacy (null
// without privacy.dp; else {epsilon, delta, rounds, sampling_rate, target_epsilon,
// rounds_left}, the last two null without a target), spec (the task in
// task-file form), history: [{round, participants, dropped, mean_train_loss, num_samples,
// model_version, duration_ms, evaluated, test_accuracy, test_loss, test_samples}]. Enum values
// are friendly lower-case names ("federated-sync", "running"); test_* are null when the round
// was not evaluated; non-finite numbers are null.
std::string TaskStatusToJson(const coordinator::v1::TaskStatus& status);

// One round as a JSON object, exactly as an entry of TaskStatusToJson's history (and of
// `task history --json`).
std::string RoundToJson(const coordinator::v1::RoundSummary& round);

// Multi-line human-readable status for `task status`.
std::string FormatTaskStatus(const coordinator::v1::TaskStatus& status);
// privacy.dp tasks: the privacy spent (TaskStatus.privacy) as JSON, "null" without it.
std::string PrivacyToJson(const coordinator::v1::TaskStatus& status);
// privacy.dp tasks: the "privacy:" lines of FormatTaskStatus ("" without DP).
std::string FormatPrivacyLine(const coordinator::v1::TaskStatus& status);

// Federated-sync: each peer's median time from a round's open to its accepted update over the
// rounds of status.history, slowest first ("round times:" and one line per peer); "" when no
// round has peer times.
std::string FormatPeerRoundTimes(const coordinator::v1::TaskStatus& status);

// A table of tasks for `task list` (a header line even when empty).
std::string FormatTaskList(const std::vector<coordinator::v1::TaskStatus>& tasks);

// The live line of `task watch` / `shoalctl local` on a terminal, without a newline, e.g.
// "round 3/10 [######--------------]  30%  peers 4  loss 0.4123  acc 0.8512  training".
// Progress counts finished rounds (history) against spec.rounds; `acc` is that of the newest
// round whose evaluation is complete (never a partial sum of the peers' reports).
std::string FormatProgressLine(const coordinator::v1::TaskStatus& status, int bar_width = 24);

// The line printed when not on a terminal (logs, CI): it describes the newest settled round
// (closed, and evaluated or past evaluating) and the task's state, so it changes once per round
// and when the state, its message or the number of peers changes, e.g.
// "round 3/10 [#######-----------------]  30%  peers 4  loss 0.4123  acc 0.8512".
std::string FormatProgressLogLine(const coordinator::v1::TaskStatus& status, int bar_width = 24);

// The per-round table printed when a task ends: round, participants, dropped, train loss,
// test accuracy, duration; then a line with the final state and accuracy.
std::string FormatSummary(const coordinator::v1::TaskStatus& status);

// FormatSummary's table, for rounds from elsewhere (`task history`): the header line, then one
// line per round. The columns are the mode's (its ModeDefinition's round_columns,
// libs/task/task_mode.h): federated-async tasks show versions, updates and staleness;
// decentralized ones joins, leaves, retries, removed and overhead.
std::string FormatRoundTableHeader(common::v1::Mode mode);
std::string FormatRoundTableRow(common::v1::Mode mode, const coordinator::v1::RoundSummary& round);

// The test accuracy of the last evaluated round, or -1 when none was evaluated.
double LastTestAccuracy(const coordinator::v1::TaskStatus& status);

// "850ms", "12.3s", "3m05s", "1h02m".
std::string FormatDurationMs(int64_t ms);

}  // namespace shoal::shoalctl
