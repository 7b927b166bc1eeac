// A node's local capacity: cores and memory from the scheduler, /proc and cgroup files (a fake
// cgroup directory here), the matrix-multiply score, and the BLAS library a process loaded.

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "libs/capacity/blas_library.h"
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

TEST(BlasLibraryTest, TheReferenceBlasIsTheOneInADirectoryNamedBlas) {
  using Kind = BlasLibrary::Kind;
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"), Kind::kReference);
  EXPECT_EQ(ClassifyBlas("/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3"),
            Kind::kOptimised);
  EXPECT_EQ(ClassifyBlas("/opt/blis/lib/libblas.so.3"), Kind::kOptimised);
  EXPECT_EQ(ClassifyBlas(""), Kind::kNone);
  EXPECT_EQ(
      DescribeBlas({Kind::kOptimised, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"}),
      "OpenBLAS at /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3");
  EXPECT_EQ(DescribeBlas({Kind::kReference, "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"}),
            "the reference BLAS at /usr/lib/x86_64-linux-gnu/blas/libblas.so.3");
  EXPECT_EQ(DescribeBlas({}), "built in");
  // Warnings: the reference BLAS (slow) and OpenBLAS's serial build (unsafe for threads that call
  // it at once); not the threaded build, nor a BLAS of someone else's.
  const std::optional<std::string> serial =
      BlasWarning({Kind::kOptimised, "/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3"});
  ASSERT_TRUE(serial.has_value());
  EXPECT_THAT(*serial, ::testing::HasSubstr("install libopenblas0-pthread"));
  const std::optional<std::string> reference =
      BlasWarning({Kind::kReference, "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"});
  ASSERT_TRUE(reference.has_value());
  EXPECT_THAT(*reference, ::testing::HasSubstr("1.7x slower"));
  EXPECT_FALSE(
      BlasWarning({Kind::kOptimised, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"}));
  EXPECT_FALSE(BlasWarning({Kind::kOptimised, "/opt/blis/lib/libblas.so.3"}));
}

// The library Debian's LibTorch loads (libblas.so.3) is found once loaded, and on a machine
// scripts/bootstrap set up it is OpenBLAS's threaded build: with the reference BLAS every
// training test and benchmark runs about 1.7 times as long, and with the serial build the tests
// that train several models in one process now and then get wrong products.
TEST(BlasLibraryTest, FindsTheLoadedBlasAndItIsOptimisedHere) {
  EXPECT_EQ(LoadedBlas().kind, BlasLibrary::Kind::kNone);  // this test loads no LibTorch
  void* handle = dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << "libblas.so.3 (LibTorch's BLAS) does not load: " << dlerror();
  const BlasLibrary blas = LoadedBlas();
  EXPECT_NE(blas.kind, BlasLibrary::Kind::kNone);
  EXPECT_EQ(blas.kind, BlasLibrary::Kind::kOptimised)
      << DescribeBlas(blas) << ": scripts/bootstrap installs libopenblas0-pthread";
  EXPECT_FALSE(BlasWarning(blas).has_value()) << BlasWarning(blas).value_or("");
  EXPECT_TRUE(std::filesystem::path(blas.path).is_absolute()) << blas.path;
  EXPECT_TRUE(std::filesystem::exists(blas.path)) << blas.path;
  dlclose(handle);
}

}  // namespace
}  // namespace shoal::capacity
