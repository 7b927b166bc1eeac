// `shoalctl local`, the launcher behind scripts/demo, run as a real process: it trains a small
// task to completion and exits 0, and on Ctrl-C it stops every child it started.

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/shoalctl/process.h"

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

LauncherRun StartLauncher(const std::string& prefix) {
  LauncherRun run;
  auto dir = process::MakeTempDir("", prefix);
  EXPECT_TRUE(dir.ok()) << dir.status();
  run.state_dir = *dir + "/state";
  run.log = *dir + "/shoalctl.log";
  process::ProcessOptions options;
  options.name = "shoalctl";
  options.binary = BinDir() + "/shoalctl";
  options.args = {"local", "--peers", "2", "--task", TaskFile(), "--state-dir", run.state_dir};
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
  LauncherRun run = StartLauncher("shoal-launcher-int-");
  // Wait until training is under way (the live line reports a round), then interrupt.
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (absl::Now() < deadline &&
         process::TailFile(run.log, 50).find("training") == std::string::npos) {
    ASSERT_TRUE(run.launcher->Running()) << process::TailFile(run.log, 40);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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
