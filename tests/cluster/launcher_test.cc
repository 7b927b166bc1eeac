// `shoalctl local`, the launcher behind scripts/demo, run as a real process: it trains a small
// task to completion and exits 0, and on Ctrl-C it stops every child it started.

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/shoalctl/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::testing {
namespace {

using ::testing::HasSubstr;

std::string BinDir() {
  const char* bin = std::getenv("SHOAL_BIN_DIR");
  return bin != nullptr ? bin : "build/bin";
}

std::string TaskFile() {
  const char* src = std::getenv("SHOAL_SOURCE_DIR");
  return absl::StrCat(src != nullptr ? src : ".", "/tests/data/tasks/cluster-small.yaml");
}

// Pids of live processes whose command line mentions `needle` (every child of a launcher run
// gets paths under its state dir).
std::vector<int> ProcessesMentioning(const std::string& needle) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::stringstream cmdline;
    cmdline << in.rdbuf();
    if (cmdline.str().find(needle) == std::string::npos) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string skip, state;
    stat >> skip >> skip >> state;
    if (state != "Z") pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

struct LauncherRun {
  std::unique_ptr<process::Process> launcher;
  std::string state_dir;
  std::string log;
};

// Starts `shoalctl local` on TaskFile(), or on it with `rounds` rounds when given.
LauncherRun StartLauncher(const std::string& prefix, std::optional<int> rounds = std::nullopt) {
  LauncherRun run;
  auto dir = MakeTestTempDir(prefix);
  EXPECT_TRUE(dir.ok()) << dir.status();
  run.state_dir = *dir + "/state";
  run.log = *dir + "/shoalctl.log";
  std::string task_file = TaskFile();
  if (rounds.has_value()) {
    std::ifstream in(task_file);
    std::string text, line;
    while (std::getline(in, line)) {
      text += absl::StartsWith(line, "rounds:") ? absl::StrCat("rounds: ", *rounds) : line;
      text += "\n";
    }
    task_file = *dir + "/task.yaml";
    std::ofstream(task_file) << text;
  }
  process::ProcessOptions options;
  options.name = "shoalctl";
  options.binary = BinDir() + "/shoalctl";
  options.args = {"local", "--peers", "2", "--task", task_file, "--state-dir", run.state_dir};
  options.log_path = run.log;
  auto launcher = process::Process::Start(std::move(options));
  EXPECT_TRUE(launcher.ok()) << launcher.status();
  run.launcher = *std::move(launcher);
  return run;
}

TEST(LauncherTest, TrainsTheTaskPrintsASummaryAndLeavesNothingRunning) {
  LauncherRun run = StartLauncher("shoal-launcher-");
  auto exit = run.launcher->Wait(absl::Minutes(5));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << process::TailFile(run.log, 40);
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << process::TailFile(run.log, 40);
  const std::string output = process::TailFile(run.log, 200);
  EXPECT_THAT(output, HasSubstr("task launcher-small completed after 3/3 rounds"));
  EXPECT_THAT(output, HasSubstr("final test accuracy: 0."));
  EXPECT_TRUE(ProcessesMentioning(run.state_dir).empty()) << "children left behind";
}

TEST(LauncherTest, CtrlCStopsEveryChild) {
  // Far more rounds than the test lets it run, so the interrupt always lands mid-task (the
  // 3-round task can finish first on a quiet machine, or before a slow one shows a round).
  LauncherRun run = StartLauncher("shoal-launcher-int-", 1000);
  // Wait until training is under way (the first round is reported; in a log the launcher prints
  // a line per settled round, not per phase), then interrupt.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return !run.launcher->Running() ||
               process::TailFile(run.log, 50).find("round 1/1000") != std::string::npos;
      },
      absl::Minutes(5), absl::Milliseconds(50)));
  ASSERT_TRUE(run.launcher->Running()) << process::TailFile(run.log, 40);
  ASSERT_FALSE(ProcessesMentioning(run.state_dir).empty()) << "the cluster should be running";
  run.launcher->Signal(SIGINT);
  auto exit = run.launcher->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->success());
  std::string left;
  for (int pid : ProcessesMentioning(run.state_dir)) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::stringstream cmdline;
    cmdline << in.rdbuf();
    absl::StrAppend(&left, pid, ": ", cmdline.str(), "\n");
  }
  EXPECT_TRUE(left.empty()) << "children left behind:\n" << left << process::TailFile(run.log, 30);
}

}  // namespace
}  // namespace shoal::testing
