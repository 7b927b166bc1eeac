// A node's local capacity: cores and memory from the scheduler, /proc and cgroup files (a fake
// cgroup directory here), and the matrix-multiply score.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "libs/capacity/local_capacity.h"

namespace shoal::capacity {
namespace {

class CapacityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-capacity-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "cgroup");
    paths_.cgroup = (dir_ / "cgroup").string();
    paths_.meminfo = (dir_ / "meminfo").string();
    Write("meminfo",
          "MemTotal:       16384000 kB\nMemFree:         1000000 kB\n"
          "MemAvailable:   12288000 kB\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }

  std::filesystem::path dir_;
  SystemPaths paths_;
};

TEST_F(CapacityTest, WithoutCgroupLimitsTheMachineCounts) {
  const uint32_t cores = UsableCores(paths_);
  EXPECT_GE(cores, 1u);
  EXPECT_LE(cores, static_cast<uint32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_EQ(MemoryBytes(paths_), uint64_t{16384000} * 1024);
  EXPECT_EQ(AvailableMemoryBytes(paths_), uint64_t{12288000} * 1024);
  Write("cgroup/cpu.max", "max 100000\n");
  Write("cgroup/memory.max", "max\n");
  EXPECT_EQ(UsableCores(paths_), cores);
  EXPECT_EQ(MemoryBytes(paths_), uint64_t{16384000} * 1024);
}

TEST_F(CapacityTest, ACgroupQuotaAndLimitCapTheFigures) {
  Write("cgroup/cpu.max", "50000 100000\n");  // half a core: counted as one
  Write("cgroup/memory.max", "1073741824\n");
  Write("cgroup/memory.current", "268435456\n");
  EXPECT_EQ(UsableCores(paths_), 1u);
  EXPECT_EQ(MemoryBytes(paths_), uint64_t{1} << 30);
  EXPECT_EQ(AvailableMemoryBytes(paths_), uint64_t{768} << 20);
}

TEST_F(CapacityTest, UnreadableFilesGiveZeroNotACrash) {
  paths_.meminfo = (dir_ / "missing").string();
  Write("cgroup/memory.max", "garbage\n");
  Write("cgroup/cpu.max", "1 2 3\n");
  EXPECT_EQ(MemoryBytes(paths_), 0u);
  EXPECT_EQ(AvailableMemoryBytes(paths_), 0u);
  EXPECT_GE(UsableCores(paths_), 1u);
}

TEST_F(CapacityTest, TheMatrixMultiplyScoreIsPositiveAndTheDescriptionNamesEveryFigure) {
  EXPECT_GT(MatmulGflops(32, 2), 0.0);
  common::v1::Capacity capacity = MeasureLocalCapacity(paths_);
  EXPECT_GE(capacity.cpu_cores(), 1u);
  EXPECT_GT(capacity.matmul_gflops(), 0.0);
  EXPECT_EQ(capacity.upload_bytes_per_second(), 0.0);
  EXPECT_EQ(capacity.reachability(), common::v1::REACHABILITY_UNKNOWN);
  capacity.set_cpu_cores(4);
  capacity.set_matmul_gflops(20.04);
  capacity.set_upload_bytes_per_second(1.5e8);
  capacity.set_reachability(common::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(Describe(capacity),
            "4 cores, 20.0 GFLOP/s, 15.6 GiB (11.7 GiB free), upload 150 MB/s, unreachable");
}

}  // namespace
}  // namespace shoal::capacity
