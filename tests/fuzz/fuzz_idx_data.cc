// IDX data sets (LoadIdx on an images file and a labels file cut from the input). Input layout:
// a big-endian uint16 N, then the images file (the next N bytes, or all that is left), then the
// labels file (the rest); either may be gzipped. max_bytes is 64 MiB, so that a small header
// cannot make the loader allocate gigabytes. A data set that loads must be consistent (count *
// sample size values, all finite, count labels each below the class count, no zero dimension).
// Errors must be clean (no raw control bytes).

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "libs/data/idx_dataset.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// One directory per process, on tmpfs when there is one, with the two files rewritten in place
// for every input; removed at exit.
class InputFiles {
 public:
  InputFiles() {
    const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/shoal-fuzz-idx-XXXXXX";
    SHOAL_FUZZ_CHECK(mkdtemp(templ.data()) != nullptr);
    dir_ = templ;
    images_ = dir_ + "/images.idx";
    labels_ = dir_ + "/labels.idx";
    images_fd_ = Open(images_);
    labels_fd_ = Open(labels_);
  }
  ~InputFiles() {
    close(images_fd_);
    close(labels_fd_);
    unlink(images_.c_str());
    unlink(labels_.c_str());
    rmdir(dir_.c_str());
  }
  InputFiles(const InputFiles&) = delete;
  InputFiles& operator=(const InputFiles&) = delete;

  void Write(const uint8_t* images, size_t images_size, const uint8_t* labels, size_t labels_size) {
    Replace(images_fd_, images, images_size);
    Replace(labels_fd_, labels, labels_size);
  }
  const std::string& images() const { return images_; }
  const std::string& labels() const { return labels_; }

 private:
  static int Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    SHOAL_FUZZ_CHECK(fd >= 0);
    return fd;
  }
  static void Replace(int fd, const uint8_t* data, size_t size) {
    SHOAL_FUZZ_CHECK(ftruncate(fd, 0) == 0);
    SHOAL_FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  }

  std::string dir_;
  std::string images_;
  std::string labels_;
  int images_fd_ = -1;
  int labels_fd_ = -1;
};

void CheckDataset(const shoal::data::Dataset& data) {
  SHOAL_FUZZ_CHECK(data.count > 0);
  SHOAL_FUZZ_CHECK(!data.sample_shape.empty());
  for (int64_t d : data.sample_shape) SHOAL_FUZZ_CHECK(d > 0);
  SHOAL_FUZZ_CHECK(data.values.size() == data.count * data.SampleSize());
  SHOAL_FUZZ_CHECK(data.labels.size() == data.count);
  SHOAL_FUZZ_CHECK(!data.class_names.empty());
  for (uint32_t label : data.labels) SHOAL_FUZZ_CHECK(label < data.class_names.size());
  for (float v : data.values) SHOAL_FUZZ_CHECK(std::isfinite(v));
  SHOAL_FUZZ_CHECK(data.feature_names.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static InputFiles files;
  if (size < 2) return 0;
  const size_t rest = size - 2;
  const size_t split = std::min<size_t>((size_t{data[0]} << 8) | data[1], rest);
  files.Write(data + 2, split, data + 2 + split, rest - split);
  shoal::data::IdxOptions options;
  options.max_bytes = uint64_t{64} << 20;
  absl::StatusOr<shoal::data::Dataset> loaded =
      shoal::data::LoadIdx(files.images(), files.labels(), options);
  shoal::fuzz::CheckErrorIsClean(loaded.status());
  if (!loaded.ok()) return 0;
  CheckDataset(*loaded);
  return 0;
}
