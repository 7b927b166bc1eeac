// Every binary, run as a real process: --help lists its own flags and exits 0, --version names
// the Shoal version and commit and exits 0, an unknown flag exits 2 naming it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/build_info.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Output {
  int code = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Output RunBinary(const std::string& binary, const std::string& args) {
  const char* bin_dir = std::getenv("SHOAL_BIN_DIR");
  const std::string dir = ::testing::TempDir();
  const std::string out = absl::StrCat(dir, "/cli.out"), err = absl::StrCat(dir, "/cli.err");
  const std::string command = absl::StrCat(bin_dir != nullptr ? bin_dir : "build/bin", "/", binary,
                                           " ", args, " >", out, " 2>", err, " </dev/null");
  const int status = std::system(command.c_str());
  Output o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = ReadAll(out);
  o.err = ReadAll(err);
  return o;
}

struct Binary {
  std::string name;
  std::string own_flag;  // a flag --help must list
};

class CommandLineProcessTest : public ::testing::TestWithParam<Binary> {};

TEST_P(CommandLineProcessTest, HelpListsOwnFlagsAndExitsZero) {
  const Binary& b = GetParam();
  Output o = RunBinary(b.name, "--help");
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr(b.own_flag));
  EXPECT_THAT(o.out, Not(HasSubstr("No flags matched")));
  EXPECT_THAT(o.out, Not(HasSubstr("absl/flags")));
  EXPECT_THAT(o.out, Not(HasSubstr("--flagfile")));
}

TEST_P(CommandLineProcessTest, VersionNamesVersionAndCommit) {
  const Binary& b = GetParam();
  Output o = RunBinary(b.name, "--version");
  EXPECT_EQ(o.code, 0) << o.err;
  const shoal::BuildInfo& info = shoal::GetBuildInfo();
  EXPECT_THAT(o.out, StartsWith(absl::StrCat(b.name, " ", info.version, " (commit ")));
  EXPECT_THAT(o.out, Not(HasSubstr("Debug build")));
  EXPECT_FALSE(info.commit.empty());
}

TEST_P(CommandLineProcessTest, UnknownFlagExitsTwoNamingIt) {
  const Binary& b = GetParam();
  Output o = RunBinary(b.name, "--no-such-flag=1");
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_THAT(o.err, HasSubstr("no-such-flag"));
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, CommandLineProcessTest,
    ::testing::Values(Binary{"shoal-coordinator", "--heartbeat-interval"},
                      Binary{"shoal-aggregator", "--max-concurrent-pushes"},
                      Binary{"shoal-peer", "--torch-threads"}, Binary{"shoal-train", "--task-file"},
                      Binary{"shoalctl", "--coordinator"},
                      Binary{"shoal-control-example", "COORDINATOR_HOST:PORT"}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n) {
        if (c == '-') c = '_';
      }
      return n;
    });

// A bad value (not only an unknown name) is a usage error too.
TEST(CommandLineProcess, BadValueExitsTwoNamingTheFlag) {
  Output o = RunBinary("shoal-coordinator", "--heartbeat-interval=often --insecure");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--heartbeat-interval"));
  // A value of the right type out of range: refused before the service starts.
  o = RunBinary("shoal-coordinator", "--redial-interval=200ms --insecure --state-dir=/nonexistent");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--redial-interval: must be 0 (off) or at least 1s"));
  o = RunBinary("shoal-coordinator", "--store-tls --insecure --state-dir=/nonexistent");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--store-tls: only with --store etcd://"));
  o = RunBinary("shoal-coordinator",
                "--store-tls --store=etcd://127.0.0.1:1 --insecure --state-dir=/nonexistent");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--store-tls: needs --tls-dir"));
  o = RunBinary("shoal-coordinator", "--advertise=c0:7000 --insecure --state-dir=/nonexistent");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--advertise: only with --store etcd://"));
  o = RunBinary("shoal-coordinator",
                "--advertise=c0 --store=etcd://127.0.0.1:1 --insecure --state-dir=/nonexistent");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--advertise: expected HOST:PORT"));
  o = RunBinary("shoal-aggregator", "--max-concurrent-pushes");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.err, HasSubstr("--max-concurrent-pushes needs a value"));
}

}  // namespace
