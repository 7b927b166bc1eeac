#pragma once

// Scratch directories for tests that leave state behind (cluster state, checkpoints, logs):
// removed when the test that made one passes (or is skipped), kept with its path printed when
// it fails, so that its logs can be read. A directory made outside a test (e.g. in
// SetUpTestSuite) is removed at the end of the program when every test passed. Removal happens
// after the test fixture is destroyed, so the processes a test stops in its destructors have
// stopped by then.

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace shoal::testing {
namespace internal {

// Registered with GoogleTest's listeners on first use; GoogleTest owns it from then on.
class TempDirCleaner final : public ::testing::EmptyTestEventListener {
 public:
  static TempDirCleaner& Get() {
    static TempDirCleaner* const cleaner = [] {
      auto* c = new TempDirCleaner;
      ::testing::UnitTest::GetInstance()->listeners().Append(c);
      return c;
    }();
    return *cleaner;
  }

  void Add(std::string dir) {
    const bool in_test = ::testing::UnitTest::GetInstance()->current_test_info() != nullptr;
    absl::MutexLock lock(&mu_);
    (in_test ? test_dirs_ : program_dirs_).push_back(std::move(dir));
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    std::vector<std::string> dirs;
    {
      absl::MutexLock lock(&mu_);
      dirs.swap(test_dirs_);
    }
    Finish(dirs, !info.result()->Failed());
  }

  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    std::vector<std::string> dirs;
    {
      absl::MutexLock lock(&mu_);
      dirs.swap(program_dirs_);
    }
    Finish(dirs, !unit.Failed());
  }

 private:
  static void Finish(const std::vector<std::string>& dirs, bool remove) {
    for (const std::string& dir : dirs) {
      if (!remove) {
        std::fprintf(stderr, "[ kept     ] %s (the test failed: its logs are there)\n",
                     dir.c_str());
        continue;
      }
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (ec) std::fprintf(stderr, "cannot remove %s: %s\n", dir.c_str(), ec.message().c_str());
    }
  }

  absl::Mutex mu_;
  std::vector<std::string> test_dirs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> program_dirs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

// A new directory $TMPDIR/<prefix>XXXXXX (/tmp without TMPDIR), removed as described above.
inline absl::StatusOr<std::string> MakeTestTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", prefix, "XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a directory like ", pattern, ": ", std::strerror(errno)));
  }
  internal::TempDirCleaner::Get().Add(pattern);
  return pattern;
}

}  // namespace shoal::testing
