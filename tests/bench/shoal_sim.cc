// shoal-sim: N simulated peers in one process against the real coordinator and aggregator code
// (issue 13 §8). Each simulated peer is a light peer (tests/bench/light_peer.h): a real session
// with the coordinator and real calls to its aggregator, answering as shoal-peer does, with a
// cheap deterministic update instead of training. It starts its own shoal-coordinator (or hosts
// the coordinator's code in this process: --in-process, --direct) and shoal-aggregator
// processes, holds the peers while a federated task runs rounds, and reports errors, the
// coordinator's RSS over time, the size of the task's status and the latency of round events. A
// small baseline fleet runs first in the same run, so the latencies come with a ratio to it.
//
// With --model-mb (scripts/bench-round) the model and every update are that large and each peer
// pulls every version it does not hold, so a round is the whole data path (the update pushed,
// aggregated, the new version published, checkpointed by the coordinator and pulled by every
// peer); it then reports the round time against the same bytes over raw TCP, one transfer after
// another, measured in the same run, and the aggregator's peak RSS.
//
// With --secure (scripts/bench-privacy) the task has secure aggregation and each round is a
// SecAgg+ exchange between the peers and the aggregator; --drop-after-masking makes a fraction of
// the peers leave each round after masking, and --rounds ends the phase after that many rounds.
// Every phase prints what its rounds cost: CPU per round and the bytes of each update call.
//
// With --coordinators N (N > 1; --etcd for one) the coordinators share their tasks on one etcd
// member started for the run (--share-tasks): the measured phase creates one task per
// coordinator, --peers split over them, each fleet's sessions at the coordinator that serves its
// task, and the latencies are over every task's peers: the peers N coordinators carry.
//
//   shoal-sim [--peers 1000] [--duration 5m] [--baseline-peers 10]
//             [--baseline-duration 30s] [--warmup 60s] [--bin-dir DIR]
//             [--model-mb 0] [--max-concurrent-pushes 16] [--in-process | --direct] ...
//
// Exit code 0 when there were no errors, 1 otherwise.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "libs/common/command_line.h"
#include "libs/rpc/model_stream.h"
#include "services/shoalctl/process.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"
#include "tests/bench/light_peer.h"
#include "tests/bench/proc_stats.h"
#include "tests/bench/sim_coordinators.h"
#include "tests/bench/sim_rounds.h"
#include "tests/bench/sim_secure.h"
#include "tests/testing/http_get.h"

ABSL_FLAG(int, peers, 1000, "concurrent peer sessions in the measured phase");
ABSL_FLAG(absl::Duration, duration, absl::Minutes(5), "how long the measured phase holds them");
ABSL_FLAG(int, baseline_peers, 10, "peers of the baseline phase run first (0 = no baseline)");
ABSL_FLAG(absl::Duration, baseline_duration, absl::Seconds(30), "length of the baseline phase");
ABSL_FLAG(int, rounds, 0,
          "end the measured phase once this many rounds after the first are complete (at the "
          "latest after --duration; 0: after --duration)");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(60),
          "RSS growth is measured from this point of the measured phase to its end");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "the coordinator's --heartbeat-interval (its default)");
ABSL_FLAG(int, model_mb, 0,
          "model and update size in MB (10^6 bytes); > 0: peers also pull every model version "
          "and the data path is reported");
ABSL_FLAG(double, join_rate, 0,
          "sessions opened per second in each phase (0: all at once, as in the reconnect storm "
          "after a coordinator restart)");
ABSL_FLAG(int, max_concurrent_pushes, 16, "the aggregator's --max-concurrent-pushes");
ABSL_FLAG(bool, exact_sum, false, "the task's aggregation_options.exact_sum (mean summed exactly)");
ABSL_FLAG(int, model_kb, 0,
          "model and update size in kB (10^3 bytes) without the downloads of --model-mb "
          "(0: 64 bytes)");
ABSL_FLAG(int, aggregators, 1, "shoal-aggregator processes to start");
ABSL_FLAG(bool, hierarchical, false,
          "the task's topology is hierarchical (clusters of --cluster-size, one aggregator each, "
          "below a root): start 1 + peers / cluster size aggregators");
ABSL_FLAG(int, cluster_size, 32, "with --hierarchical: the task's cluster_size");
ABSL_FLAG(bool, in_process, false,
          "host the coordinator in this process and open every session over its in-process "
          "channel (no socket: the coordinator's own cost, without TCP and HTTP/2 per peer); "
          "the aggregators stay processes. CPU and RSS are then this process's, peers included");
ABSL_FLAG(bool, direct, false,
          "as --in-process, but the sessions call the coordinator's core directly, with no gRPC "
          "between them: the coordinator's own cost per peer and event, without any transport");
ABSL_FLAG(int, coordinators, 1,
          "coordinators sharing their tasks on one etcd member (--share-tasks); > 1: the measured "
          "phase runs one task per coordinator, --peers split over them, and the latencies are "
          "over every task's peers");
ABSL_FLAG(bool, etcd, false,
          "the coordinators' store is one etcd member started for the run (implied by "
          "--coordinators > 1); otherwise SQLite");
ABSL_FLAG(absl::Duration, store_lease, absl::Seconds(10),
          "with etcd: the coordinators' --store-lease");
ABSL_FLAG(std::string, bin_dir, "",
          "where shoal-coordinator and shoal-aggregator are "
          "(default: this binary's directory)");

namespace {

namespace cv1 = shoal::coordinator::v1;
using shoal::bench::CoordinatorTransport;
using shoal::bench::CpuSeconds;
using shoal::bench::Fleet;
using shoal::bench::Latencies;
using shoal::bench::LoadAverage;
using shoal::bench::Measure;
using shoal::bench::Percentile;
using shoal::bench::RssMiB;
using shoal::bench::StatusMiB;

// The terminal's stderr; with --in-process, stderr itself goes to the coordinator's log.
int g_stderr = STDERR_FILENO;

[[noreturn]] void Die(const std::string& what) {
  std::fflush(stdout);
  dprintf(g_stderr, "shoal-sim: %s\n", what.c_str());
  std::exit(1);
}

class Bench {
 public:
  explicit Bench(std::string bin_dir) : bin_dir_(std::move(bin_dir)) {}

  void StartServices() {
    auto dir = shoal::process::MakeTempDir("", "shoal-coordinator-bench-");
    if (!dir.ok()) Die(std::string(dir.status().message()));
    dir_ = *dir;
    shoal::bench::SimCoordinatorOptions options;
    options.count = absl::GetFlag(FLAGS_coordinators);
    options.etcd = absl::GetFlag(FLAGS_etcd) || options.count > 1;
    options.transport = absl::GetFlag(FLAGS_direct)       ? CoordinatorTransport::kDirect
                        : absl::GetFlag(FLAGS_in_process) ? CoordinatorTransport::kInProcess
                                                          : CoordinatorTransport::kTcp;
    options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
    options.store_lease = absl::GetFlag(FLAGS_store_lease);
    options.dir = dir_;
    options.bin_dir = bin_dir_;
    if (options.transport != CoordinatorTransport::kTcp) RedirectLogs();
    auto coordinators = shoal::bench::SimCoordinators::Start(options);
    if (!coordinators.ok()) Die("coordinators: " + std::string(coordinators.status().message()));
    coordinators_ = *std::move(coordinators);
    if (options.etcd) {
      std::printf("%d coordinator(s) sharing their tasks on one etcd member: %s\n",
                  coordinators_->size(), coordinators_->Addresses().c_str());
    }
    for (int i = 0; i < AggregatorCount(); ++i) {
      auto aggregator = shoal::bench::StartSimService(
          dir_, bin_dir_, absl::StrCat("aggregator-", i), "shoal-aggregator",
          {"--coordinator=" + coordinators_->Addresses(),
           absl::StrCat("--max-concurrent-pushes=", absl::GetFlag(FLAGS_max_concurrent_pushes))});
      if (!aggregator.ok()) Die(std::string(aggregator.status().message()));
      aggregator_metrics_[aggregator->address] = aggregator->metrics;
      aggregators_.push_back(std::move(aggregator->process));
    }
  }

  // What the in-process coordinator (and the light peers) log goes to a file, as a process's
  // would, not between the figures.
  void RedirectLogs() {
    const std::string log = dir_ + "/coordinator.log";
    g_stderr = dup(STDERR_FILENO);
    if (g_stderr < 0 || std::freopen(log.c_str(), "a", stderr) == nullptr) {
      Die("cannot write " + log);
    }
    std::printf("coordinator (in this process) logs to %s (kept if the run has errors)\n",
                log.c_str());
  }

  // --model-mb in bytes (0: the model is --model-kb's, or 64 bytes, and is not downloaded).
  static int64_t ModelBytes() { return int64_t{absl::GetFlag(FLAGS_model_mb)} * 1'000'000; }

  static int AggregatorCount() {
    if (!absl::GetFlag(FLAGS_hierarchical)) return std::max(1, absl::GetFlag(FLAGS_aggregators));
    const int size = std::max(2, absl::GetFlag(FLAGS_cluster_size));
    return std::max(absl::GetFlag(FLAGS_aggregators),
                    1 + (absl::GetFlag(FLAGS_peers) + size - 1) / size);
  }

  // Every aggregator's `metric` (a counter), by address.
  std::map<std::string, double> AggregatorCounters(const std::string& metric) {
    std::map<std::string, double> values;
    for (const auto& [address, metrics] : aggregator_metrics_) {
      auto page = shoal::testing::HttpGet(metrics, "/metrics");
      values[address] = page.ok() ? shoal::testing::MetricValue(*page, metric) : -1;
    }
    return values;
  }

  double AggregatorsCpu() {
    double cpu = 0;
    for (const auto& a : aggregators_) cpu += CpuSeconds(a->pid());
    return cpu;
  }

  // One task of a phase: its name, the coordinator that serves it and its peers.
  struct PhaseTask {
    std::string name;
    int coordinator = 0;
    std::unique_ptr<Fleet> fleet;
  };

  // Creates `tasks` tasks of the phase (one: named `name`; several: `name`-1, -2, ...), `peers`
  // split over them, each fleet pointed at the coordinator that serves its task.
  std::vector<PhaseTask> CreateFleets(const std::string& name, int peers, int tasks) {
    std::vector<PhaseTask> created;
    std::vector<int> per_coordinator(coordinators_->size(), 0);
    for (int k = 0; k < tasks; ++k) {
      PhaseTask task;
      task.name = tasks == 1 ? name : absl::StrCat(name, "-", k + 1);
      const int task_peers = peers / tasks + (k < peers % tasks ? 1 : 0);
      auto coordinator = coordinators_->CreateTask(TaskSpec(task.name, task_peers));
      if (!coordinator.ok()) Die("CreateTask: " + std::string(coordinator.status().message()));
      task.coordinator = *coordinator;
      ++per_coordinator[task.coordinator];
      Fleet::Options options;
      options.peers = task_peers;
      options.name_prefix = task.name;
      coordinators_->Connect(task.coordinator, options);
      options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
      options.join_rate = absl::GetFlag(FLAGS_join_rate) / tasks;
      shoal::bench::ApplySecureFlags(options);
      const int64_t model_bytes = ModelBytes();
      if (model_bytes > 0) {
        options.model_floats = model_bytes / 4;
        options.download = true;
      } else if (absl::GetFlag(FLAGS_model_kb) > 0) {
        options.model_floats = int64_t{absl::GetFlag(FLAGS_model_kb)} * 1000 / 4;
      }
      task.fleet = std::make_unique<Fleet>(options);
      created.push_back(std::move(task));
    }
    if (tasks > 1) {
      std::string spread;
      for (int i = 0; i < coordinators_->size(); ++i) {
        absl::StrAppend(&spread, i == 0 ? "" : ", ", per_coordinator[i]);
      }
      std::printf("%s: %d tasks of %d peers or so; tasks per coordinator: %s\n", name.c_str(),
                  tasks, peers / tasks, spread.c_str());
    }
    return created;
  }

  // Runs one phase: `tasks` tasks for exactly `peers` peers together, the fleets held for
  // `duration`.
  void Phase(const std::string& name, int peers, int tasks, absl::Duration duration,
             absl::Duration warmup, bool report_rss) {
    std::vector<PhaseTask> phase = CreateFleets(name, peers, tasks);
    auto sum = [&phase](const std::function<int64_t(const Fleet&)>& of) {
      int64_t total = 0;
      for (const PhaseTask& t : phase) total += of(*t.fleet);
      return total;
    };
    auto complete_rounds = [&phase] {
      int complete = phase.front().fleet->CompleteRounds();
      for (const PhaseTask& t : phase) complete = std::min(complete, t.fleet->CompleteRounds());
      return complete;
    };
    const double crashed_before = coordinators_->Metric("shoal_coordinator_peers_crashed_total");
    const absl::Time t0 = absl::Now();
    for (PhaseTask& t : phase) t.fleet->Start();
    auto assigned = [&] { return sum([](const Fleet& f) { return f.assigned(); }); };
    auto welcomed = [&] { return sum([](const Fleet& f) { return f.welcomed(); }); };
    // Joins take longer with more peers: at least 2 minutes, 20 ms a peer beyond 6,000, and
    // the ramp's length with a join rate.
    absl::Duration join_limit = std::max(absl::Minutes(2), absl::Milliseconds(20) * peers);
    const double join_rate = absl::GetFlag(FLAGS_join_rate);
    if (join_rate > 0) join_limit += absl::Seconds(peers / join_rate);
    absl::Time next_progress = t0 + absl::Seconds(10);
    while (assigned() < peers && absl::Now() - t0 < join_limit) {
      absl::SleepFor(absl::Milliseconds(50));
      if (absl::Now() >= next_progress) {  // long joins show their pace
        next_progress += absl::Seconds(10);
        std::printf(
            "%s: joining: %lld welcomed, %lld assigned after %.0f s; coordinator RSS %.1f MiB, "
            "CPU %.1f s\n",
            name.c_str(), static_cast<long long>(welcomed()), static_cast<long long>(assigned()),
            absl::ToDoubleSeconds(absl::Now() - t0), coordinators_->RssMiB(),
            coordinators_->CpuSeconds());
        std::fflush(stdout);
      }
    }
    const double connect_s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (assigned() < peers) {
      Die(absl::StrCat(name, ": only ", assigned(), " of ", peers, " sessions assigned (",
                       welcomed(), " welcomed, ",
                       sum([](const Fleet& f) { return f.errors().streams_broken.load(); }),
                       " broken) within ", absl::FormatDuration(join_limit)));
    }
    const double rss_start = coordinators_->RssMiB();
    std::printf("%s: %d sessions welcomed and assigned in %.1f s; coordinator RSS %.1f MiB\n",
                name.c_str(), peers, connect_s, rss_start);
    std::fflush(stdout);

    const absl::Time start = absl::Now();
    const double cpu_start = coordinators_->CpuSeconds();
    const double etcd_cpu_start = coordinators_->EtcdCpuSeconds();
    const double aggregator_cpu_start = AggregatorsCpu();
    const auto bytes_start = AggregatorCounters("shoal_aggregator_bytes_received_total");
    const uint64_t round_start = TaskStatus(phase.front().name).round();
    const double self_cpu_start = CpuSeconds(getpid());
    double rss_warm = rss_start, rss_max = rss_start;
    bool warm = false;
    shoal::bench::RoundCost cost([this] { return AggregatorsCpu(); });
    const int max_rounds = report_rss ? absl::GetFlag(FLAGS_rounds) : 0;  // the measured phase
    while (absl::Now() - start < duration) {
      absl::SleepFor(max_rounds > 0 ? absl::Milliseconds(100) : absl::Seconds(1));
      const int measured = cost.Update(complete_rounds());
      const double rss = coordinators_->RssMiB();
      rss_max = std::max(rss_max, rss);
      if (!warm && absl::Now() - start >= warmup) {
        warm = true;
        rss_warm = rss;
      }
      if (absl::Status s = coordinators_->CheckRunning(); !s.ok()) Die(std::string(s.message()));
      if (max_rounds > 0 && measured >= max_rounds) break;
    }
    const double rss_end = coordinators_->RssMiB();
    const double cpu = coordinators_->CpuSeconds() - cpu_start;
    const double etcd_cpu = coordinators_->EtcdCpuSeconds() - etcd_cpu_start;
    const double aggregator_cpu = AggregatorsCpu() - aggregator_cpu_start;
    const auto bytes_end = AggregatorCounters("shoal_aggregator_bytes_received_total");
    const double self_cpu = CpuSeconds(getpid()) - self_cpu_start;
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    std::vector<cv1::TaskStatus> statuses;
    for (const PhaseTask& t : phase) statuses.push_back(TaskStatus(t.name));
    // Sessions the coordinator ended for missed heartbeats (or found broken) while the fleet
    // held them all: each is an error, even where the light peer has not noticed yet.
    const int64_t crashed = static_cast<int64_t>(
        coordinators_->Metric("shoal_coordinator_peers_crashed_total") - crashed_before);
    // The light peers advertise an address that refuses connections: each is dialed back once.
    const double unreachable =
        coordinators_->Metric("shoal_coordinator_dial_backs_total{result=\"unreachable\"}");
    int64_t dropped = 0;
    Latencies l;
    l.rounds = -1;  // the fewest rounds any task completed
    for (size_t k = 0; k < phase.size(); ++k) {
      Fleet& fleet = *phase[k].fleet;
      fleet.Stop();
      StopTask(phase[k].name);
      dropped += shoal::bench::UnexpectedDrops(statuses[k], fleet.dropping());
      Latencies task = Measure(fleet.Rounds(), static_cast<size_t>(fleet.peers()));
      l.rounds = l.rounds < 0 ? task.rounds : std::min(l.rounds, task.rounds);
      for (auto [all, one] :
           {std::pair{&l.round_ms, &task.round_ms}, std::pair{&l.fanout_ms, &task.fanout_ms},
            std::pair{&l.publish_ms, &task.publish_ms}}) {
        all->insert(all->end(), one->begin(), one->end());
      }
    }
    const int64_t broken = sum([](const Fleet& f) { return f.errors().streams_broken.load(); });
    const int64_t failed = sum([](const Fleet& f) { return f.errors().calls_failed.load(); });
    const int64_t rejected = sum([](const Fleet& f) { return f.errors().rejected.load(); });
    const int64_t lost = sum([](const Fleet& f) { return f.errors().events_lost.load(); });
    const int64_t errors = broken + failed + rejected + lost + dropped + crashed;
    errors_ += errors;
    const cv1::TaskStatus& status = statuses.front();
    std::printf(
        "%s: %d peers for %s: %d rounds completed (task at round %llu%s), %lld heartbeats, "
        "%lld aggregator back-pressure retries\n",
        name.c_str(), peers, absl::FormatDuration(duration).c_str(), l.rounds,
        static_cast<unsigned long long>(status.round()),
        phase.size() > 1 ? "; the fewest of any task, the first task's round" : "",
        static_cast<long long>(sum([](const Fleet& f) { return f.heartbeats_sent(); })),
        static_cast<long long>(sum([](const Fleet& f) { return f.push_retries(); })));
    std::printf(
        "%s: errors %lld (broken sessions %lld, failed calls %lld, executor full %lld, events "
        "lost %lld, dropped from rounds (beyond --drop-after-masking) %lld, declared crashed by "
        "the coordinator %lld)\n",
        name.c_str(), static_cast<long long>(errors), static_cast<long long>(broken),
        static_cast<long long>(failed), static_cast<long long>(rejected),
        static_cast<long long>(lost), static_cast<long long>(dropped),
        static_cast<long long>(crashed));
    int listed = 0;
    for (const auto& r : status.history()) listed += r.lists_omitted() ? 0 : 1;
    std::printf("%s: status of the running task: %.2f MB (%d rounds of history, %d with lists)\n",
                name.c_str(), static_cast<double>(status.ByteSizeLong()) / 1e6,
                status.history_size(), listed);
    const std::string who =
        coordinators_->hosted()
            ? absl::StrCat(coordinators_->size() == 1 ? "coordinator" : "coordinators",
                           " and peers (one process)")
        : coordinators_->size() == 1 ? "coordinator"
                                     : absl::StrCat("the ", coordinators_->size(), " coordinators");
    std::printf("%s: %s CPU %.1f s in %.0f s (%.0f%% of one core); load average %.1f\n",
                name.c_str(), who.c_str(), cpu, wall, 100 * cpu / wall, LoadAverage());
    if (etcd_cpu > 0) {
      std::printf("%s: etcd CPU %.1f s (%.0f%% of one core)\n", name.c_str(), etcd_cpu,
                  100 * etcd_cpu / wall);
    }
    std::printf("%s: peers dialed back (refused) since the coordinator started: %.0f\n",
                name.c_str(), unreachable);
    if (report_rss) {
      std::printf(
          "%s: %s RSS start %.1f MiB, after %s warm-up %.1f MiB, end %.1f MiB "
          "(growth after warm-up %+.1f MiB), max %.1f MiB\n",
          name.c_str(), who.c_str(), rss_start, absl::FormatDuration(warmup).c_str(), rss_warm,
          rss_end, rss_end - rss_warm, rss_max);
    }
    if (phase.size() == 1) {  // several tasks share the aggregators
      PrintIngress(name, status, bytes_start, bytes_end,
                   static_cast<int>(status.round() - round_start));
    }
    std::printf("%s: CPU of the %zu aggregators %.1f s in %.0f s\n", name.c_str(),
                aggregators_.size(), aggregator_cpu, wall);
    PrintLatency(name, "round (first RoundStarted -> last ModelPublished)", l.round_ms, name);
    PrintLatency(name, "RoundStarted fan-out (arrival - first arrival)", l.fanout_ms, name);
    PrintLatency(name, "ModelPublished after the last accepted push", l.publish_ms, name);
    if (phase.size() == 1) cost.Print(name, *phase.front().fleet, l);
    const int64_t model_bytes = ModelBytes();
    if (model_bytes > 0) {
      if (absl::Status s = shoal::bench::PrintDataPath(name, phase.front().fleet->Rounds(), peers,
                                                       model_bytes, aggregators_.front()->pid(),
                                                       absl::GetFlag(FLAGS_max_concurrent_pushes));
          !s.ok()) {
        Die(std::string(s.message()));
      }
      const double rounds = std::max(1.0, static_cast<double>(l.rounds));
      std::printf(
          "%s: CPU per round: aggregator %.2f s, coordinator %.2f s, the light peers (this "
          "process) %.2f s; %.1f cores of %ld busy on average\n",
          name.c_str(), aggregator_cpu / rounds, cpu / rounds, self_cpu / rounds,
          (aggregator_cpu + cpu + self_cpu) / wall, sysconf(_SC_NPROCESSORS_ONLN));
    }
    std::fflush(stdout);
    phases_.push_back(std::move(l));
  }

  // What flowed into the task's root aggregator (its bytes_received counter) per round of the
  // phase, and into all the aggregators.
  void PrintIngress(const std::string& name, const cv1::TaskStatus& status,
                    const std::map<std::string, double>& start,
                    const std::map<std::string, double>& end, int rounds) {
    double all = 0;
    for (const auto& [address, bytes] : end) all += bytes - start.at(address);
    const std::string& root = status.aggregator();
    const double into_root = end.count(root) ? end.at(root) - start.at(root) : -1;
    const double per = std::max(1, rounds);
    std::printf(
        "%s: bytes into the root aggregator per round %.0f (%d rounds; %d clusters); into all "
        "%zu aggregators %.0f per round\n",
        name.c_str(), into_root / per, rounds, std::max(1, status.clusters_size() - 1), end.size(),
        all / per);
  }

  void PrintRatios() {
    if (phases_.size() < 2) return;
    const Latencies& base = phases_.front();
    const Latencies& load = phases_.back();
    auto ratio = [](const std::vector<double>& a, const std::vector<double>& b, double p) {
      const double pb = Percentile(b, p);
      return pb > 0 ? Percentile(a, p) / pb : 0.0;
    };
    std::printf(
        "ratio measured/baseline: round p50 %.2f p99 %.2f; fan-out p50 %.2f p99 %.2f; publish p50 "
        "%.2f p99 %.2f\n",
        ratio(load.round_ms, base.round_ms, 0.5), ratio(load.round_ms, base.round_ms, 0.99),
        ratio(load.fanout_ms, base.fanout_ms, 0.5), ratio(load.fanout_ms, base.fanout_ms, 0.99),
        ratio(load.publish_ms, base.publish_ms, 0.5),
        ratio(load.publish_ms, base.publish_ms, 0.99));
  }

  int64_t errors() const { return errors_; }
  void Stop() {
    std::vector<shoal::process::Process*> aggregators;
    for (const auto& a : aggregators_) aggregators.push_back(a.get());
    shoal::process::StopInOrder({aggregators}, absl::Seconds(10));
    coordinators_->Stop();
  }

  // The services' logs and state are kept when the run had errors, removed otherwise.
  void RemoveOrKeepLogs() const {
    if (errors_ > 0) {
      std::printf("the services' logs and state are kept in %s\n", dir_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  static void PrintLatency(const std::string& phase, const char* what, const std::vector<double>& v,
                           const std::string&) {
    std::printf("%s: %-52s p50 %8.1f ms  p99 %8.1f ms  (n=%zu)\n", phase.c_str(), what,
                Percentile(v, 0.5), Percentile(v, 0.99), v.size());
  }

  // The phase's task: federated-sync rounds of exactly `peers` peers, run until stopped.
  static shoal::common::v1::TaskSpec TaskSpec(const std::string& name, int peers) {
    shoal::common::v1::TaskSpec spec;
    spec.set_name(name);
    spec.set_mode(shoal::common::v1::MODE_FEDERATED_SYNC);
    spec.set_model("mlp");
    spec.mutable_dataset()->set_name("fashion-mnist");
    spec.mutable_dataset()->set_partition(shoal::common::v1::PARTITION_IID);
    spec.set_batch_size(32);
    spec.mutable_optimizer()->set_kind(shoal::common::v1::OPTIMIZER_SGD);
    spec.mutable_optimizer()->set_learning_rate(0.01);
    spec.set_round_batches(1);
    spec.set_rounds(1000000);  // stopped at the end of the phase
    spec.set_min_participants(static_cast<uint32_t>(peers));
    spec.set_max_participants(static_cast<uint32_t>(peers));
    spec.set_round_deadline_seconds(60);
    spec.set_aggregation(shoal::common::v1::AGGREGATION_MEAN);
    if (absl::GetFlag(FLAGS_exact_sum)) spec.mutable_aggregation_options()->set_exact_sum(true);
    shoal::bench::ApplySecureFlags(spec);
    if (absl::GetFlag(FLAGS_hierarchical)) {
      spec.set_topology(shoal::common::v1::TOPOLOGY_HIERARCHICAL);
      spec.set_cluster_size(static_cast<uint32_t>(absl::GetFlag(FLAGS_cluster_size)));
    }
    spec.set_seed(1);
    return spec;
  }

  cv1::TaskStatus TaskStatus(const std::string& name) {
    auto status = coordinators_->TaskStatus(name);
    if (!status.ok()) Die("GetTaskStatus: " + std::string(status.status().message()));
    return *std::move(status);
  }

  void StopTask(const std::string& name) { coordinators_->StopTask(name); }

  const std::string bin_dir_;
  std::string dir_;
  std::unique_ptr<shoal::bench::SimCoordinators> coordinators_;
  std::vector<std::unique_ptr<shoal::process::Process>> aggregators_;
  std::map<std::string, std::string> aggregator_metrics_;  // gRPC address -> metrics address
  std::vector<Latencies> phases_;
  int64_t errors_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  // The light peers move models as shoal-peer does, with its allocator settings (without them
  // each round's 1.6 GB of stream buffers is faulted in afresh: 4x the peers' CPU here).
  shoal::rpc::TuneAllocatorForModelStreams();
  shoal::ParseCommandLineOrExit(
      argc, argv,
      {.program = "shoal-sim",
       .usage = "[--peers N] [--duration D] [--baseline-peers N] [--baseline-duration D] "
                "[--warmup D] [--rounds N] [--in-process | --direct] [--secure] [--bin-dir DIR]",
       .summary = "Simulates N peers in one process against a real coordinator and aggregator "
                  "while a federated task runs rounds; reports errors, coordinator RSS, the "
                  "status's size and round-event latencies."});
  if (absl::GetFlag(FLAGS_in_process) && absl::GetFlag(FLAGS_direct)) {
    Die("--in-process and --direct: choose one (--direct hosts the coordinator in this process "
        "too)");
  }
  if (absl::GetFlag(FLAGS_coordinators) > 1 &&
      (absl::GetFlag(FLAGS_model_mb) > 0 || absl::GetFlag(FLAGS_secure))) {
    Die("--coordinators measures the peers several coordinators carry, with one task each: "
        "--model-mb and --secure measure one task's rounds and take one coordinator");
  }
  // Over TCP each session is one connection: two descriptors per peer across the two
  // processes, and the coordinator (our child) inherits the raised limit. Hosted here, the
  // sessions take none.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  const int peers = absl::GetFlag(FLAGS_peers);
  const bool hosted = absl::GetFlag(FLAGS_in_process) || absl::GetFlag(FLAGS_direct);
  if (!hosted && limit.rlim_cur < static_cast<rlim_t>(peers) + 256) {
    Die(absl::StrCat("RLIMIT_NOFILE is ", limit.rlim_cur, ", too low for ", peers, " sessions"));
  }
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) {
    auto self = shoal::process::SelfExecutableDir();
    if (!self.ok()) Die(std::string(self.status().message()));
    bin_dir = *self;  // build/bin, beside shoal-coordinator
  }

  Bench bench(bin_dir);
  bench.StartServices();
  if (const int base = absl::GetFlag(FLAGS_baseline_peers); base > 0) {
    bench.Phase("baseline", base, 1, absl::GetFlag(FLAGS_baseline_duration), absl::ZeroDuration(),
                false);
  }
  bench.Phase("measured", peers, absl::GetFlag(FLAGS_coordinators), absl::GetFlag(FLAGS_duration),
              absl::GetFlag(FLAGS_warmup), true);
  bench.PrintRatios();
  bench.Stop();
  std::printf("errors: %lld\n", static_cast<long long>(bench.errors()));
  bench.RemoveOrKeepLogs();
  return bench.errors() == 0 ? 0 : 1;
}
