#include "services/shoalctl/task_format.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/task/task_file.h"
#include "libs/task/task_mode.h"
#include "services/shoalctl/node_format.h"
#include "services/shoalctl/statistics_format.h"

namespace shoal::shoalctl {
namespace {

using coordinator::v1::RoundSummary;
using coordinator::v1::TaskStatus;
using task::JsonNumber;
using task::JsonQuote;

std::string JsonStringArray(const google::protobuf::RepeatedPtrField<std::string>& values) {
  std::vector<std::string> quoted;
  quoted.reserve(values.size());
  for (const std::string& v : values) quoted.push_back(JsonQuote(v));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

std::string PeerToJson(const coordinator::v1::PeerProgress& p) {
  return absl::StrCat("{\"peer_id\":", JsonQuote(p.peer_id()), ",\"state\":", JsonQuote(p.state()),
                      ",\"model_round\":", p.model_round(), ",\"step\":", p.step(),
                      ",\"clock\":", JsonNumber(p.clock()), ",\"loss\":", JsonNumber(p.loss()),
                      ",\"updates\":", p.updates(), "}");
}

std::string PeerDataToJson(const coordinator::v1::PeerData& d) {
  return absl::StrCat("{\"peer_id\":", JsonQuote(d.peer_id()),
                      ",\"train_samples\":", d.train_samples(),
                      ",\"test_samples\":", d.test_samples(), ",\"label_histogram\":[",
                      absl::StrJoin(d.label_histogram(), ","), "]}");
}

// {"peer": value} over the round's peer times.
template <typename Value>
std::string PeerTimesToJson(const RoundSummary& r, Value value) {
  std::vector<std::string> items;
  for (const auto& t : r.peer_times()) {
    items.push_back(absl::StrCat(JsonQuote(t.peer_id()), ":", value(t)));
  }
  return absl::StrCat("{", absl::StrJoin(items, ","), "}");
}

// The median of `values` (0 when empty).
int64_t Median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A round's list sizes: its counts where the coordinator left the lists out of this copy of it
// (RoundSummary.lists_omitted).
int Participants(const RoundSummary& r) {
  return r.lists_omitted() ? static_cast<int>(r.participant_count()) : r.participants_size();
}
int Dropped(const RoundSummary& r) {
  return r.lists_omitted() ? static_cast<int>(r.dropped_count()) : r.dropped_size();
}
int Late(const RoundSummary& r) {
  return r.lists_omitted() ? static_cast<int>(r.late_count()) : r.late_size();
}

// What a federated-sync round moved: each participant's download of the model and the
// updates as they travelled; "-" when not measured.
std::string MovedBytes(const RoundSummary& r) {
  if (r.model_bytes() == 0) return "-";
  const double bytes = static_cast<double>(r.update_bytes()) +
                       static_cast<double>(r.model_bytes()) * Participants(r);
  if (bytes >= 1e9) return absl::StrFormat("%.2fGB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1fMB", bytes / 1e6);
  return absl::StrFormat("%.0fkB", bytes / 1e3);
}

// What the task counts: rounds, or model versions (federated-async).
const std::string& StepWord(const TaskStatus& status) {
  return task::ModeDefinitionOrDefault(status.spec().mode()).step;
}

std::string Fixed(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  return absl::StrFormat("%.*f", digits, value);
}

const RoundSummary* LastEvaluated(const TaskStatus& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    if (status.history(i).evaluated()) return &status.history(i);
  }
  return nullptr;
}

// The newest round whose evaluation is over: its accuracy will not change any more.
const RoundSummary* LastFullyEvaluated(const TaskStatus& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    const RoundSummary& r = status.history(i);
    if (r.evaluated() && (r.evaluation_complete() || IsTerminal(status.state()))) return &r;
  }
  return nullptr;
}

// Rounds before the history the status carries (the coordinator sends the newest 100).
int RoundsBefore(const TaskStatus& status) {
  return status.history_size() > 0 ? static_cast<int>(status.history(0).round()) - 1 : 0;
}

// How many rounds of the status' history are settled: closed, and evaluated or past evaluating
// (a later round closed, or the task ended).
int SettledRounds(const TaskStatus& status) {
  const int n = status.history_size();
  if (n == 0) return 0;
  const bool last_settled =
      status.history(n - 1).evaluation_complete() || IsTerminal(status.state());
  return last_settled ? n : n - 1;
}

std::string Bar(size_t done, uint32_t total, int bar_width) {
  const double fraction = total > 0 ? static_cast<double>(done) / total : 0;
  bar_width = std::max(bar_width, 1);
  const int filled = static_cast<int>(std::lround(fraction * bar_width));
  return absl::StrFormat("[%s%s] %3d%%", std::string(filled, '#'),
                         std::string(bar_width - filled, '-'),
                         static_cast<int>(std::lround(fraction * 100)));
}

// "  completed", "  waiting: why", or "" while running.
std::string StateSuffix(const TaskStatus& status) {
  if (status.state() == coordinator::v1::TASK_STATE_RUNNING) return "";
  std::string out = absl::StrCat("  ", StateName(status.state()));
  if (status.state() != coordinator::v1::TASK_STATE_COMPLETED && !status.message().empty()) {
    absl::StrAppend(&out, ": ", status.message());
  }
  return out;
}

}  // namespace

std::string RoundToJson(const RoundSummary& r) {
  return absl::StrCat(
      "{\"round\":", r.round(), ",\"participants\":", JsonStringArray(r.participants()),
      ",\"dropped\":", JsonStringArray(r.dropped()),
      ",\"mean_train_loss\":", JsonNumber(r.mean_train_loss()),
      ",\"num_samples\":", r.num_samples(), ",\"model_version\":", r.model_version(),
      ",\"duration_ms\":", r.duration_ms(), ",\"evaluated\":", r.evaluated() ? "true" : "false",
      ",\"evaluation_complete\":", r.evaluation_complete() ? "true" : "false",
      ",\"test_accuracy\":", r.evaluated() ? JsonNumber(r.test_accuracy()) : "null",
      ",\"test_loss\":", r.evaluated() ? JsonNumber(r.test_loss()) : "null",
      ",\"test_samples\":", r.evaluated() ? absl::StrCat(r.test_samples()) : "null",
      ",\"model_digest\":",
      r.model_digest() != 0 ? JsonQuote(absl::StrFormat("%016x", r.model_digest())) : "null",
      ",\"joins\":", r.joins(), ",\"leaves\":", r.leaves(),
      ",\"connection_retries\":", r.connection_retries(),
      ",\"removed\":", JsonStringArray(r.removed()), ",\"overhead_ms\":", r.overhead_ms(),
      ",\"completed_unix_ms\":", r.completed_unix_ms(),
      ",\"mean_staleness\":", JsonNumber(r.mean_staleness()), ",\"note\":", JsonQuote(r.note()),
      ",\"peer_times\":", PeerTimesToJson(r, [](const auto& t) { return t.ms(); }),
      ",\"peer_train_ms\":", PeerTimesToJson(r, [](const auto& t) { return t.train_ms(); }),
      ",\"peer_update_bytes\":", PeerTimesToJson(r, [](const auto& t) { return t.update_bytes(); }),
      ",\"update_bytes\":", r.update_bytes(), ",\"model_bytes\":", r.model_bytes(),
      ",\"late\":", JsonStringArray(r.late()), ",\"participant_count\":", Participants(r),
      ",\"dropped_count\":", Dropped(r), ",\"late_count\":", Late(r),
      ",\"lists_omitted\":", r.lists_omitted() ? "true" : "false",
      ",\"epsilon\":", r.epsilon() > 0 ? JsonNumber(r.epsilon()) : "null", "}");
}

// Each peer's median time from a round's open to its accepted update, over the rounds of the
// history that have one, slowest first; and of that, the median training and the rest (the
// model's download, the delta, the push).
std::string FormatPeerRoundTimes(const TaskStatus& status) {
  struct Times {
    std::vector<int64_t> total, train, rest;
  };
  std::map<std::string, Times> times;
  for (const RoundSummary& r : status.history()) {
    for (const auto& t : r.peer_times()) {
      Times& p = times[t.peer_id()];
      p.total.push_back(t.ms());
      if (t.train_ms() > 0) {
        p.train.push_back(t.train_ms());
        p.rest.push_back(std::max<int64_t>(0, t.ms() - t.train_ms()));
      }
    }
  }
  if (times.empty()) return "";
  std::vector<std::pair<int64_t, std::string>> medians;
  for (const auto& [peer, t] : times) medians.emplace_back(Median(t.total), peer);
  std::sort(medians.rbegin(), medians.rend());
  std::string out =
      "round times:   open to update accepted, each peer's median over the rounds "
      "above\n";
  for (const auto& [ms, peer] : medians) {
    const Times& t = times[peer];
    const std::string split =
        t.train.empty() ? ""
                        : absl::StrCat("  train ", FormatDurationMs(Median(t.train)),
                                       ", model and push ", FormatDurationMs(Median(t.rest)));
    absl::StrAppend(&out, "  ",
                    absl::StrFormat("%-16s %8s  (%d rounds)%s\n", peer, FormatDurationMs(ms),
                                    t.total.size(), split));
  }
  return out;
}

bool IsTerminal(coordinator::v1::TaskState state) {
  return state == coordinator::v1::TASK_STATE_COMPLETED ||
         state == coordinator::v1::TASK_STATE_STOPPED ||
         state == coordinator::v1::TASK_STATE_FAILED;
}

std::string StateName(coordinator::v1::TaskState state) {
  return task::FriendlyEnumName(*coordinator::v1::TaskState_descriptor(), state);
}

std::string PhaseName(coordinator::v1::RoundPhase phase) {
  return task::FriendlyEnumName(*coordinator::v1::RoundPhase_descriptor(), phase);
}

std::string ModeName(common::v1::Mode mode) {
  return task::FriendlyEnumName(*common::v1::Mode_descriptor(), mode);
}

double LastTestAccuracy(const TaskStatus& status) {
  const RoundSummary* r = LastEvaluated(status);
  return r != nullptr ? r->test_accuracy() : -1;
}

std::string TaskStatusToJson(const TaskStatus& status) {
  std::vector<std::string> history;
  history.reserve(status.history_size());
  for (const RoundSummary& r : status.history()) history.push_back(RoundToJson(r));
  std::vector<std::string> peers;
  peers.reserve(status.peers_size());
  for (const auto& p : status.peers()) peers.push_back(PeerToJson(p));
  std::vector<std::string> data;
  data.reserve(status.data_size());
  for (const auto& d : status.data()) data.push_back(PeerDataToJson(d));
  const RoundSummary* last = LastEvaluated(status);
  std::vector<std::string> clusters;
  for (const auto& c : status.clusters()) {
    clusters.push_back(absl::StrCat(
        "{\"aggregator\":", JsonQuote(c.aggregator()), ",\"child_id\":", JsonQuote(c.child_id()),
        ",\"level\":", c.level(), ",\"parent\":", JsonQuote(c.parent()),
        ",\"host_peer\":", JsonQuote(c.host_peer()), ",\"backups\":", JsonStringArray(c.backups()),
        ",\"peers\":", JsonStringArray(c.peers()), "}"));
  }
  return absl::StrCat(
      "{\"name\":", JsonQuote(status.spec().name()),
      ",\"mode\":", JsonQuote(ModeName(status.spec().mode())),
      ",\"state\":", JsonQuote(StateName(status.state())),
      ",\"phase\":", JsonQuote(PhaseName(status.phase())), ",\"round\":", status.round(),
      ",\"rounds\":", status.spec().rounds(),
      ",\"participants\":", JsonStringArray(status.participants()),
      ",\"async_peers\":", JsonStringArray(status.async_peers()), ",\"peers\":[",
      absl::StrJoin(peers, ","), "],\"data\":[", absl::StrJoin(data, ","), "]",
      ",\"model_version\":", status.model_version(),
      ",\"aggregator\":", JsonQuote(status.aggregator()), ",\"clusters\":[",
      absl::StrJoin(clusters, ","), "]", ",\"nodes\":", NodesToJson(status.nodes()),
      ",\"message\":", JsonQuote(status.message()),
      ",\"created_unix_ms\":", status.created_unix_ms(),
      ",\"last_test_accuracy\":", last != nullptr ? JsonNumber(last->test_accuracy()) : "null",
      ",\"privacy\":", PrivacyToJson(status), ",\"statistics\":", StatisticsToJson(status),
      ",\"spec\":", task::MessageToFriendlyJson(status.spec()), ",\"history\":[",
      absl::StrJoin(history, ","), "]}");
}

std::string PrivacyToJson(const TaskStatus& status) {
  if (!status.has_privacy()) return "null";
  const coordinator::v1::PrivacyStatus& p = status.privacy();
  return absl::StrCat(
      "{\"epsilon\":", JsonNumber(p.epsilon()), ",\"delta\":", JsonNumber(p.delta()),
      ",\"rounds\":", p.rounds(), ",\"steps\":", p.steps() > 0 ? p.steps() : p.rounds(),
      ",\"sampling_rate\":", JsonNumber(p.sampling_rate()),
      ",\"target_epsilon\":", p.target_epsilon() > 0 ? JsonNumber(p.target_epsilon()) : "null",
      ",\"rounds_left\":", p.target_epsilon() > 0 ? absl::StrCat(p.rounds_left()) : "null", "}");
}

std::string FormatPrivacyLine(const TaskStatus& status) {
  if (!status.has_privacy() || !status.spec().privacy().has_dp()) return "";
  const coordinator::v1::PrivacyStatus& p = status.privacy();
  const common::v1::DpSpec& dp = status.spec().privacy().dp();
  std::string out = absl::StrFormat("privacy:       epsilon %.4g at delta %g after %d rounds",
                                    p.epsilon(), p.delta(), p.rounds());
  if (p.target_epsilon() > 0) {
    absl::StrAppend(
        &out, absl::StrFormat(" (target %g", p.target_epsilon()),
        p.rounds() > 0 ? absl::StrCat(": ", p.rounds_left(), " more rounds fit)") : ")");
  }
  if (dp.level() == common::v1::DP_LEVEL_SAMPLE) {
    absl::StrAppend(
        &out, absl::StrFormat("\n               sample-level DP-SGD: clip_norm %g, "
                              "noise_multiplier %g, %d steps at sampling rate %.4g\n",
                              dp.clip_norm(), dp.noise_multiplier(), p.steps(), p.sampling_rate()));
    return out;
  }
  absl::StrAppend(
      &out,
      absl::StrFormat("\n               peer-level DP: clip_norm %g, noise_multiplier "
                      "%g, noise %s\n",
                      dp.clip_norm(), dp.noise_multiplier(),
                      dp.noise() == common::v1::DP_NOISE_DISTRIBUTED ? "distributed" : "central"));
  return out;
}

std::string FormatDurationMs(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return absl::StrCat(ms, "ms");
  if (ms < 60'000) return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1000);
  const int64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string FormatProgressLine(const TaskStatus& status, int bar_width) {
  const uint32_t total = status.spec().rounds();
  const size_t done = std::min<size_t>(RoundsBefore(status) + status.history_size(), total);
  std::string line =
      absl::StrFormat("%s %d/%d %s  peers %d", StepWord(status), status.round(), total,
                      Bar(done, total, bar_width), status.participants_size());
  if (status.history_size() > 0) {
    absl::StrAppend(&line, "  loss ",
                    Fixed(status.history(status.history_size() - 1).mean_train_loss(), 4));
  }
  if (const RoundSummary* r = LastFullyEvaluated(status)) {
    absl::StrAppend(&line, "  acc ", Fixed(r->test_accuracy(), 4));
  }
  if (status.state() == coordinator::v1::TASK_STATE_RUNNING) {
    if (status.phase() != coordinator::v1::ROUND_PHASE_UNSPECIFIED) {
      absl::StrAppend(&line, "  ", PhaseName(status.phase()));
    }
  } else {
    absl::StrAppend(&line, StateSuffix(status));
  }
  return line;
}

std::string FormatProgressLogLine(const TaskStatus& status, int bar_width) {
  const uint32_t total = status.spec().rounds();
  const int settled = SettledRounds(status);
  const int done = RoundsBefore(status) + settled;
  std::string line = absl::StrFormat("%s %d/%d %s  peers %d", StepWord(status), done, total,
                                     Bar(std::min<size_t>(done, total), total, bar_width),
                                     status.participants_size());
  if (settled > 0) {
    const RoundSummary& r = status.history(settled - 1);
    absl::StrAppend(&line, "  loss ", Fixed(r.mean_train_loss(), 4));
    if (r.evaluated()) absl::StrAppend(&line, "  acc ", Fixed(r.test_accuracy(), 4));
  }
  return line + StateSuffix(status);
}

namespace {

// How shoalctl shows a column of the round table: its header, its width (negative: left-aligned)
// and its cell.
struct ColumnFormat {
  const char* header;
  int width;
  std::string (*cell)(const RoundSummary& r);
};

// The contributors' training times and the rest of their times (download, delta, push).
std::vector<int64_t> TrainTimes(const RoundSummary& r, bool train) {
  std::vector<int64_t> times;
  for (const auto& t : r.peer_times()) {
    if (t.train_ms() <= 0) continue;
    times.push_back(train ? t.train_ms() : std::max<int64_t>(0, t.ms() - t.train_ms()));
  }
  return times;
}

std::string MedianTime(std::vector<int64_t> times) {
  return times.empty() ? "-" : FormatDurationMs(Median(std::move(times)));
}

ColumnFormat FormatOf(task::RoundColumn column) {
  using task::RoundColumn;
  switch (column) {
    case RoundColumn::kRound:
      return {"round", 5, [](const RoundSummary& r) { return absl::StrCat(r.round()); }};
    case RoundColumn::kVersion:
      return {"version", 7, [](const RoundSummary& r) { return absl::StrCat(r.round()); }};
    case RoundColumn::kPeers:
      return {"peers", -6, [](const RoundSummary& r) { return absl::StrCat(Participants(r)); }};
    case RoundColumn::kPeersAndLate:
      return {"peers", -6, [](const RoundSummary& r) {
                return Late(r) == 0 ? absl::StrCat(Participants(r))
                                    : absl::StrCat(Participants(r) - Late(r), "+", Late(r));
              }};
    case RoundColumn::kUpdates:
      return {"updates", -7, [](const RoundSummary& r) { return absl::StrCat(Participants(r)); }};
    case RoundColumn::kDropped:
      return {"dropped", 7, [](const RoundSummary& r) { return absl::StrCat(Dropped(r)); }};
    case RoundColumn::kStaleness:
      return {"staleness", 9, [](const RoundSummary& r) { return Fixed(r.mean_staleness(), 2); }};
    case RoundColumn::kJoins:
      return {"joins", 5, [](const RoundSummary& r) { return absl::StrCat(r.joins()); }};
    case RoundColumn::kLeaves:
      return {"leaves", 6, [](const RoundSummary& r) { return absl::StrCat(r.leaves()); }};
    case RoundColumn::kRetries:
      return {"retries", 7,
              [](const RoundSummary& r) { return absl::StrCat(r.connection_retries()); }};
    case RoundColumn::kRemoved:
      return {"removed", 7, [](const RoundSummary& r) { return absl::StrCat(r.removed_size()); }};
    case RoundColumn::kTrainLoss:
      return {"train_loss", 10,
              [](const RoundSummary& r) { return Fixed(r.mean_train_loss(), 4); }};
    case RoundColumn::kTestAccuracy:
      return {"test_acc", 8, [](const RoundSummary& r) -> std::string {
                return r.evaluated() ? Fixed(r.test_accuracy(), 4) : "-";
              }};
    case RoundColumn::kDuration:
      return {"duration", 9,
              [](const RoundSummary& r) { return FormatDurationMs(r.duration_ms()); }};
    case RoundColumn::kOverhead:
      return {"overhead", 9,
              [](const RoundSummary& r) { return FormatDurationMs(r.overhead_ms()); }};
    case RoundColumn::kMoved:
      return {"moved", 8, &MovedBytes};
    case RoundColumn::kTrainTime:
      return {"train", 7, [](const RoundSummary& r) { return MedianTime(TrainTimes(r, true)); }};
    case RoundColumn::kCommTime:
      return {"comm", 7, [](const RoundSummary& r) { return MedianTime(TrainTimes(r, false)); }};
  }
  return {"?", 1, [](const RoundSummary&) { return std::string("?"); }};
}

// One line of the round table: `cell` of each of the mode's columns.
template <typename Cell>
std::string TableLine(common::v1::Mode mode, Cell cell) {
  std::vector<std::string> cells;
  for (task::RoundColumn column : task::ModeDefinitionOrDefault(mode).round_columns) {
    const ColumnFormat format = FormatOf(column);
    cells.push_back(absl::StrFormat("%*s", format.width, cell(format)));
  }
  return absl::StrCat(absl::StrJoin(cells, "  "), "\n");
}

}  // namespace

std::string FormatRoundTableHeader(common::v1::Mode mode) {
  return TableLine(mode, [](const ColumnFormat& format) { return format.header; });
}

std::string FormatRoundTableRow(common::v1::Mode mode, const RoundSummary& r) {
  return TableLine(mode, [&r](const ColumnFormat& format) { return format.cell(r); });
}

std::string FormatSummary(const TaskStatus& status) {
  const common::v1::Mode mode = status.spec().mode();
  std::string out = FormatRoundTableHeader(mode);
  int64_t total_ms = 0;
  for (const RoundSummary& r : status.history()) {
    total_ms += r.duration_ms();
    absl::StrAppend(&out, FormatRoundTableRow(mode, r));
  }
  absl::StrAppend(&out, "task ", status.spec().name(), " ", StateName(status.state()), " after ",
                  RoundsBefore(status) + status.history_size(), "/", status.spec().rounds(), " ",
                  StepWord(status), "s in ", FormatDurationMs(total_ms));
  if (RoundsBefore(status) > 0) {
    absl::StrAppend(&out, " (the last ", status.history_size(),
                    "; `shoalctl task history` has all)");
  }
  // A task that completed before its last round (its privacy budget) says why.
  if (!status.message().empty() && (status.state() != coordinator::v1::TASK_STATE_COMPLETED ||
                                    status.round() < status.spec().rounds())) {
    absl::StrAppend(&out, " (", status.message(), ")");
  }
  absl::StrAppend(&out, "\n");
  const double acc = LastTestAccuracy(status);
  absl::StrAppend(&out, "final test accuracy: ", acc >= 0 ? Fixed(acc, 4) : "n/a", "\n");
  return out;
}

std::string FormatTaskStatus(const TaskStatus& status) {
  const auto& spec = status.spec();
  std::string out;
  absl::StrAppend(&out, "name:          ", spec.name(), "\n");
  absl::StrAppend(&out, "mode:          ", ModeName(spec.mode()), "\n");
  absl::StrAppend(&out, "state:         ", StateName(status.state()));
  if (!status.message().empty()) absl::StrAppend(&out, " (", status.message(), ")");
  absl::StrAppend(&out, "\n");
  absl::StrAppend(&out, "model:         ", spec.model(), " version ", status.model_version(), "\n");
  absl::StrAppend(&out, absl::StrFormat("%-15s", absl::StrCat(StepWord(status), ":")),
                  status.round(), "/", spec.rounds());
  if (status.phase() != coordinator::v1::ROUND_PHASE_UNSPECIFIED) {
    absl::StrAppend(&out, " (", PhaseName(status.phase()), ")");
  }
  absl::StrAppend(&out, "\n");
  absl::StrAppend(&out, "participants:  ", status.participants_size(), " [",
                  absl::StrJoin(status.participants(), ", "), "]\n");
  if (status.async_peers_size() > 0) {
    absl::StrAppend(&out, "async:         ", status.async_peers_size(), " [",
                    absl::StrJoin(status.async_peers(), ", "),
                    "] (stragglers: not waited for; their late updates count, scaled by "
                    "staleness)\n");
  }
  if (!status.aggregator().empty()) {
    absl::StrAppend(&out, "aggregator:    ", status.aggregator(), "\n");
  }
  absl::StrAppend(&out, FormatPrivacyLine(status));
  if (status.clusters_size() > 0) {
    absl::StrAppend(&out, "clusters:      ", status.clusters_size(),
                    " (hierarchical: each aggregator sums its cluster's updates and the partial "
                    "sums of those below it, up to the root)\n");
    for (const auto& c : status.clusters()) {
      absl::StrAppend(
          &out, "  level ", c.level(), " ", absl::StrFormat("%-22s", c.aggregator()), " ",
          c.peers_size(), " peers [", absl::StrJoin(c.peers(), ", "), "]",
          c.parent().empty() ? " (root)" : absl::StrCat(" below ", c.parent()),
          c.host_peer().empty() ? "" : absl::StrCat(", elected: peer ", c.host_peer()),
          c.backups().empty() ? "" : absl::StrCat(", backups: ", absl::StrJoin(c.backups(), ", ")),
          "\n");
    }
  }
  for (const auto& p : status.peers()) {
    absl::StrAppend(&out, "  ", absl::StrFormat("%-16s %-10s", p.peer_id(), p.state()));
    switch (task::ModeDefinitionOrDefault(spec.mode()).peer_column) {
      case task::PeerColumn::kGossipClock:
        absl::StrAppend(&out, absl::StrFormat(" step %d  clock %s  loss %s", p.step(),
                                              Fixed(p.clock(), 1), Fixed(p.loss(), 4)));
        break;
      case task::PeerColumn::kUpdates:
        absl::StrAppend(&out, " updates in published versions: ", p.updates());
        break;
      case task::PeerColumn::kModelRound:
        absl::StrAppend(&out, " model of round ", p.model_round());
        break;
    }
    absl::StrAppend(&out, "\n");
  }
  if (status.nodes_size() > 0) {
    absl::StrAppend(&out,
                    "nodes:         the participants and the aggregator, with their capacity\n");
    for (absl::string_view line :
         absl::StrSplit(FormatNodeTable(status.nodes()), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
  }
  if (status.data_size() > 0) {
    absl::StrAppend(&out, "data:          training samples per class, of each peer\n");
    for (const auto& d : status.data()) {
      absl::StrAppend(
          &out, "  ",
          absl::StrFormat("%-16s %7d train %6d test  [%s]\n", d.peer_id(), d.train_samples(),
                          d.test_samples(), absl::StrJoin(d.label_histogram(), " ")));
    }
  }
  absl::StrAppend(&out, FormatStatisticsLine(status));
  absl::StrAppend(&out, FormatPeerRoundTimes(status));
  const double acc = LastTestAccuracy(status);
  absl::StrAppend(&out, "test accuracy: ", acc >= 0 ? Fixed(acc, 4) : "n/a", "\n");
  if (status.history_size() > 0) {
    // The summary's table without its trailing lines: they repeat what is above.
    absl::StrAppend(&out, "\n", FormatRoundTableHeader(spec.mode()));
    for (const RoundSummary& r : status.history()) {
      absl::StrAppend(&out, FormatRoundTableRow(spec.mode(), r));
    }
  }
  return out;
}

std::string FormatTaskList(const std::vector<TaskStatus>& tasks) {
  size_t width = 4;
  for (const TaskStatus& t : tasks) width = std::max(width, t.spec().name().size());
  std::string out = absl::StrFormat("%-*s  %-14s  %-10s  %-6s  %-5s  %s\n", width, "NAME", "MODE",
                                    "STATE", "MODEL", "PEERS", "ROUND");
  for (const TaskStatus& t : tasks) {
    absl::StrAppend(
        &out, absl::StrFormat("%-*s  %-14s  %-10s  %-6s  %-5d  %d/%d\n", width, t.spec().name(),
                              ModeName(t.spec().mode()), StateName(t.state()), t.spec().model(),
                              t.participants_size(), t.round(), t.spec().rounds()));
  }
  return out;
}

}  // namespace shoal::shoalctl
