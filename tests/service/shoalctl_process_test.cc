// shoal::process: real child processes (/bin/sh), logs, exit codes, signals, address files.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/shoalctl/process.h"
#include "tests/testing/joining_thread.h"

namespace shoal::process {
namespace {

using ::testing::HasSubstr;

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTempDir("", "shoal-process-test-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }

  ProcessOptions Shell(const std::string& name, const std::string& script) {
    ProcessOptions o;
    o.name = name;
    o.binary = "/bin/sh";
    o.args = {"-c", script};
    o.log_path = absl::StrCat(dir_, "/", name, ".log");
    return o;
  }

  std::string dir_;
};

TEST_F(ProcessTest, ReportsExitCodeAndCapturesOutput) {
  ProcessOptions o =
      Shell("exits", "echo out-line; echo err-line >&2; echo $SHOAL_TEST_VAR; exit 3");
  o.env["SHOAL_TEST_VAR"] = "from-env";
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<ExitStatus> exit = (*p)->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->success());
  EXPECT_FALSE(exit->signaled);
  EXPECT_EQ(exit->code, 3);
  EXPECT_EQ(exit->ToString(), "exit code 3");
  EXPECT_EQ((*p)->LogTail(2), "err-line\nfrom-env");
  EXPECT_EQ((*p)->LogTail(10), "out-line\nerr-line\nfrom-env");
  EXPECT_FALSE((*p)->Running());
}

TEST_F(ProcessTest, MissingBinaryIsAnErrorAtStart) {
  ProcessOptions o;
  o.name = "ghost";
  o.binary = absl::StrCat(dir_, "/no-such-binary");
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no-such-binary"));
}

TEST_F(ProcessTest, StopSendsSigtermEvenWhenTheParentBlocksIt) {
  // shoalctl blocks SIGTERM in its threads; children must not inherit that.
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(Shell("sleeper", "exec sleep 60"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->Running());
  EXPECT_EQ((*p)->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const ExitStatus exit = (*p)->Stop(absl::Seconds(10));
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGTERM) << exit.ToString();
  // Idempotent.
  EXPECT_EQ((*p)->Stop(absl::Seconds(1)).signal, SIGTERM);
}

TEST_F(ProcessTest, StopEscalatesToSigkill) {
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(
      Shell("stubborn", "trap '' TERM; echo ready; while true; do sleep 0.05; done"));
  ASSERT_TRUE(p.ok()) << p.status();
  // Wait until the trap is installed.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*p)->LogTail(1) != "ready" && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ((*p)->LogTail(1), "ready");
  const ExitStatus exit = (*p)->Stop(absl::Milliseconds(300));
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGKILL) << exit.ToString();
}

TEST_F(ProcessTest, ChildGetsSigtermWhenTheStartingThreadDies) {
  std::unique_ptr<Process> child;
  shoal::testing::JoiningThread starter([&] {
    absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(Shell("orphan", "exec sleep 60"));
    ASSERT_TRUE(p.ok()) << p.status();
    child = *std::move(p);
  });
  starter.Join();
  ASSERT_NE(child, nullptr);
  absl::StatusOr<ExitStatus> exit = child->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->signaled);
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST_F(ProcessTest, WaitForAddressFileReturnsTheAddresses) {
  const std::string file = absl::StrCat(dir_, "/svc.addr");
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(Shell(
      "svc", absl::StrCat("sleep 0.2; printf 'grpc=127.0.0.1:4242\\nmetrics=127.0.0.1:4343\\n' > ",
                          file, ".tmp; mv ", file, ".tmp ", file, "; exec sleep 60")));
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<std::map<std::string, std::string>> addresses =
      WaitForAddressFile(file, p->get(), absl::Seconds(10));
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_EQ((*addresses)["grpc"], "127.0.0.1:4242");
  EXPECT_EQ((*addresses)["metrics"], "127.0.0.1:4343");
}

TEST_F(ProcessTest, WaitForAddressFileFailsFastWhenTheServiceDies) {
  const std::string file = absl::StrCat(dir_, "/dead.addr");
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start(Shell("dead", "echo 'bad flag --frob' >&2; exit 1"));
  ASSERT_TRUE(p.ok()) << p.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::map<std::string, std::string>> addresses =
      WaitForAddressFile(file, p->get(), absl::Seconds(30));
  ASSERT_FALSE(addresses.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(addresses.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(addresses.status().message()),
      ::testing::AllOf(HasSubstr("dead exited (exit code 1)"), HasSubstr("bad flag --frob")));
}

TEST_F(ProcessTest, WaitForAddressFileTimesOutAndCanBeAborted) {
  const std::string file = absl::StrCat(dir_, "/never.addr");
  EXPECT_EQ(WaitForAddressFile(file, nullptr, absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::atomic<bool> abort{true};
  EXPECT_EQ(WaitForAddressFile(file, nullptr, absl::Seconds(30), &abort).status().code(),
            absl::StatusCode::kCancelled);
}

TEST_F(ProcessTest, StopInOrderStopsEveryGroup) {
  std::vector<std::unique_ptr<Process>> procs;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<Process>> p =
        Process::Start(Shell(absl::StrCat("p", i), "exec sleep 60"));
    ASSERT_TRUE(p.ok()) << p.status();
    procs.push_back(*std::move(p));
  }
  StopInOrder({{procs[0].get(), procs[1].get()}, {procs[2].get()}}, absl::Seconds(10));
  for (auto& p : procs) EXPECT_FALSE(p->Running());
}

TEST_F(ProcessTest, StopInOrderCallsBeforeKillOnlyForAProcessPastItsGrace) {
  // One exits on SIGTERM; the other ignores it and is SIGKILLed after `before_kill` saw it.
  absl::StatusOr<std::unique_ptr<Process>> polite =
      Process::Start(Shell("polite", "exec sleep 60"));
  absl::StatusOr<std::unique_ptr<Process>> stubborn = Process::Start(
      Shell("stubborn", "trap '' TERM; echo ready; while true; do sleep 0.05; done"));
  ASSERT_TRUE(polite.ok()) << polite.status();
  ASSERT_TRUE(stubborn.ok()) << stubborn.status();
  // The trap must be set before the SIGTERM comes.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*stubborn)->LogTail(1).find("ready") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE((*stubborn)->LogTail(1).find("ready"), std::string::npos);
  std::vector<std::string> seen;
  StopInOrder({{polite->get(), stubborn->get()}}, absl::Milliseconds(500), [&](Process& p) {
    EXPECT_TRUE(p.Running());
    seen.push_back(p.name());
  });
  EXPECT_EQ(seen, std::vector<std::string>{"stubborn"});
  EXPECT_FALSE((*polite)->Running());
  EXPECT_FALSE((*stubborn)->Running());
}

TEST(ProcessHelpersTest, SelfExecutableDirAndTailFile) {
  absl::StatusOr<std::string> dir = SelfExecutableDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(access(absl::StrCat(*dir, "/shoalctl_process_test").c_str(), X_OK), 0) << *dir;
  EXPECT_EQ(TailFile("/nonexistent/file", 5), "");
}

}  // namespace
}  // namespace shoal::process
