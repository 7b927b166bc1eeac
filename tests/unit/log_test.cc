// Log lines: their format, and turning their output off (the fuzz targets that drive a core do).

#include "libs/common/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace shoal {
namespace {

using ::testing::MatchesRegex;

TEST(LogTest, WritesOneTimestampedLinePerMessage) {
  testing::internal::CaptureStderr();
  LogInfo("round ", 3, " started");
  LogWarning("peer a is slow");
  const std::string out = testing::internal::GetCapturedStderr();
  const std::string stamp = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z";
  EXPECT_THAT(out, MatchesRegex(stamp + " I shoal: round 3 started\n" + stamp +
                                " W shoal: peer a is slow\n"));
}

TEST(LogTest, OutputTurnedOffWritesNothingUntilTurnedOn) {
  SetLogOutputEnabled(false);
  testing::internal::CaptureStderr();
  LogError("not written");
  const std::string off = testing::internal::GetCapturedStderr();
  SetLogOutputEnabled(true);
  EXPECT_EQ(off, "");

  testing::internal::CaptureStderr();
  LogError("written");
  EXPECT_THAT(testing::internal::GetCapturedStderr(), MatchesRegex(".* E shoal: written\n"));
}

}  // namespace
}  // namespace shoal
