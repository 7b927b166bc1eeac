// CSV data sets (LoadCsv on a file holding the input after its first byte). Bit 0 of the first
// byte picks the labels: string classes {"a", "b", "c"} or integer labels. A table that loads
// must be consistent (count * features values, all finite, every label below the class count)
// and must standardise: its statistics are finite and the standardised values too. Errors must
// be clean (no raw control bytes).

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libs/data/csv_dataset.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// One file per process, on tmpfs when there is one, rewritten in place for every input and
// removed at exit.
class InputFile {
 public:
  InputFile() {
    const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/shoal-fuzz-csv-XXXXXX";
    SHOAL_FUZZ_CHECK(mkdtemp(templ.data()) != nullptr);
    dir_ = templ;
    path_ = dir_ + "/data.csv";
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    SHOAL_FUZZ_CHECK(fd_ >= 0);
  }
  ~InputFile() {
    close(fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& Write(const uint8_t* data, size_t size) {
    SHOAL_FUZZ_CHECK(ftruncate(fd_, 0) == 0);
    SHOAL_FUZZ_CHECK(pwrite(fd_, data, size, 0) == static_cast<ssize_t>(size));
    return path_;
  }

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

bool AllFinite(const std::vector<float>& values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

void CheckDataset(const shoal::data::Dataset& data) {
  SHOAL_FUZZ_CHECK(data.count > 0);
  SHOAL_FUZZ_CHECK(data.sample_shape.size() == 1);
  SHOAL_FUZZ_CHECK(data.feature_names.size() == data.SampleSize());
  SHOAL_FUZZ_CHECK(data.values.size() == data.count * data.SampleSize());
  SHOAL_FUZZ_CHECK(data.labels.size() == data.count);
  for (uint32_t label : data.labels) SHOAL_FUZZ_CHECK(label < data.class_names.size());
  SHOAL_FUZZ_CHECK(AllFinite(data.values));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static InputFile file;
  if (size == 0) return 0;
  shoal::data::CsvOptions options;
  options.label_column = "label";
  if (data[0] & 1) options.classes = {"a", "b", "c"};
  const std::string& path = file.Write(data + 1, size - 1);
  absl::StatusOr<shoal::data::Dataset> loaded = shoal::data::LoadCsv(path, options);
  shoal::fuzz::CheckErrorIsClean(loaded.status());
  if (!loaded.ok()) return 0;
  CheckDataset(*loaded);
  if (!options.classes.empty()) SHOAL_FUZZ_CHECK(loaded->class_names == options.classes);
  // Every finite table has finite statistics: the mean lies within the values, the population
  // standard deviation within half their range.
  absl::StatusOr<shoal::data::Standardization> stats = shoal::data::ComputeStandardization(*loaded);
  SHOAL_FUZZ_CHECK(stats.ok());
  SHOAL_FUZZ_CHECK(shoal::data::ApplyStandardization(*stats, *loaded).ok());
  SHOAL_FUZZ_CHECK(AllFinite(loaded->values));
  return 0;
}
