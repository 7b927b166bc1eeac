// ParseCommandLine: flag spellings, help and version, and the usage errors a main turns into
// exit code 2.

#include "libs/common/command_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "libs/common/build_info.h"

ABSL_FLAG(std::string, listen_address, "127.0.0.1:7000", "where to listen");
ABSL_FLAG(bool, plain, false, "serve plaintext");
ABSL_FLAG(int, workers, 4, "worker threads");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2), "how often to beat");

namespace shoal {
namespace {

using Action = CommandLineResult::Action;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const CommandLineSpec kSpec{.program = "prog",
                            .usage = "--listen-address HOST:PORT [--plain] [--workers N]",
                            .summary = "A test program."};

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_listen_address, "127.0.0.1:7000");
    absl::SetFlag(&FLAGS_plain, false);
    absl::SetFlag(&FLAGS_workers, 4);
    absl::SetFlag(&FLAGS_interval, absl::Seconds(2));
  }
};

TEST_F(CommandLineTest, AcceptsDashesUnderscoresAndBothValueForms) {
  CommandLineResult r = ParseCommandLine(
      {"--listen-address", "0.0.0.0:1", "--workers=7", "--plain", "--interval=250ms"}, kSpec);
  ASSERT_EQ(r.action, Action::kRun) << r.text;
  EXPECT_EQ(absl::GetFlag(FLAGS_listen_address), "0.0.0.0:1");
  EXPECT_EQ(absl::GetFlag(FLAGS_workers), 7);
  EXPECT_TRUE(absl::GetFlag(FLAGS_plain));
  EXPECT_EQ(absl::GetFlag(FLAGS_interval), absl::Milliseconds(250));

  r = ParseCommandLine({"--listen_address=h:2", "-workers", "9", "--noplain"}, kSpec);
  ASSERT_EQ(r.action, Action::kRun) << r.text;
  EXPECT_EQ(absl::GetFlag(FLAGS_listen_address), "h:2");
  EXPECT_EQ(absl::GetFlag(FLAGS_workers), 9);
  EXPECT_FALSE(absl::GetFlag(FLAGS_plain));
}

TEST_F(CommandLineTest, UnknownFlagIsAUsageErrorNamingIt) {
  CommandLineResult r = ParseCommandLine({"--workers=2", "--no-such-thing=1"}, kSpec);
  EXPECT_EQ(r.action, Action::kUsageError);
  EXPECT_THAT(r.text, HasSubstr("unknown flag --no-such-thing"));
}

TEST_F(CommandLineTest, AbseilBuiltinFlagsAreNotAccepted) {
  EXPECT_EQ(ParseCommandLine({"--flagfile=/etc/passwd"}, kSpec).action, Action::kUsageError);
  EXPECT_EQ(ParseCommandLine({"--fromenv=workers"}, kSpec).action, Action::kUsageError);
}

TEST_F(CommandLineTest, BadOrMissingValueIsAUsageErrorNamingTheFlag) {
  CommandLineResult r = ParseCommandLine({"--workers=many"}, kSpec);
  EXPECT_EQ(r.action, Action::kUsageError);
  EXPECT_THAT(r.text, HasSubstr("--workers"));
  EXPECT_THAT(r.text, HasSubstr("\"many\""));

  r = ParseCommandLine({"--interval=soon"}, kSpec);
  EXPECT_EQ(r.action, Action::kUsageError);
  EXPECT_THAT(r.text, HasSubstr("--interval"));

  r = ParseCommandLine({"--listen-address"}, kSpec);
  EXPECT_EQ(r.action, Action::kUsageError);
  EXPECT_THAT(r.text, HasSubstr("--listen-address needs a value"));
}

TEST_F(CommandLineTest, PositionalArgumentsOnlyWhenAllowed) {
  CommandLineResult r = ParseCommandLine({"extra"}, kSpec);
  EXPECT_EQ(r.action, Action::kUsageError);
  EXPECT_THAT(r.text, HasSubstr("\"extra\""));

  CommandLineSpec spec = kSpec;
  spec.allow_positional = true;
  r = ParseCommandLine({"eval", "--workers", "3", "a.model", "--", "--plain"}, spec);
  ASSERT_EQ(r.action, Action::kRun) << r.text;
  EXPECT_THAT(r.positional, ElementsAre("eval", "a.model", "--plain"));
  EXPECT_EQ(absl::GetFlag(FLAGS_workers), 3);
  EXPECT_FALSE(absl::GetFlag(FLAGS_plain));
}

TEST_F(CommandLineTest, HelpListsOwnFlagsWithDefaultsAndWinsOverBadFlags) {
  for (const char* spelling : {"--help", "-h", "--helpfull"}) {
    CommandLineResult r = ParseCommandLine({"--bogus", spelling}, kSpec);
    ASSERT_EQ(r.action, Action::kHelp) << spelling;
    EXPECT_THAT(r.text, HasSubstr("Usage: prog --listen-address HOST:PORT"));
    EXPECT_THAT(r.text, HasSubstr("A test program."));
    EXPECT_THAT(r.text, HasSubstr("--listen-address HOST:PORT  (default: \"127.0.0.1:7000\")"));
    EXPECT_THAT(r.text, HasSubstr("--workers N  (default: 4)"));
    EXPECT_THAT(r.text, HasSubstr("--interval DURATION  (default: 2s)"));
    EXPECT_THAT(r.text, HasSubstr("worker threads"));
    EXPECT_THAT(r.text, Not(HasSubstr("flagfile")));
    EXPECT_THAT(r.text, Not(HasSubstr("absl")));
  }
}

TEST_F(CommandLineTest, VersionNamesProgramVersionAndCommit) {
  CommandLineResult r = ParseCommandLine({"--version"}, kSpec);
  ASSERT_EQ(r.action, Action::kVersion);
  const BuildInfo& info = GetBuildInfo();
  EXPECT_FALSE(info.version.empty());
  EXPECT_FALSE(info.commit.empty());
  EXPECT_THAT(r.text, HasSubstr(std::string("prog ") + std::string(info.version) + " (commit " +
                                std::string(info.commit)));
  EXPECT_EQ(r.text, VersionLine("prog"));
}

}  // namespace
}  // namespace shoal
