// Image folders (LoadImageFolder on <tmp>/root/c0/ holding one file: the input after its first
// byte). Bit 0 of the first byte names the file x.jpg instead of x.png (the loader goes by
// signature, so both names reach both decoders); bit 1 asks for 3 channels instead of 1. The
// images are resized to 8 x 8 for the one class "c0". A folder that loads must hold one sample
// of shape {channels, 8, 8} with every value in [0, 1] and its label below the class count.
// Errors must be clean (no raw control bytes).
//
// The decoders are Debian's libpng and libjpeg-turbo, uninstrumented shared libraries: to
// libFuzzer and the sanitizers they are a black box (both are fuzzed upstream, in OSS-Fuzz), and
// this target checks what the loader makes of whatever they return. stb_image_resize, which
// resizes every decoded image, is compiled into the target (stb_resize_instrumented.cc), so ASan
// and UBSan watch it. (The loader decoded with stb_image 2.27 until this target kept finding
// memory errors in it; docs/performance-history.md, "Fuzzing record".)

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libs/data/image_folder.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr int kSide = 8;

// One folder per process, on tmpfs when there is one: <dir>/root/c0/x.png, rewritten in place
// for every input and renamed to x.jpg and back as the input asks; removed at exit.
class InputFolder {
 public:
  InputFolder() {
    const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = base + "/shoal-fuzz-images-XXXXXX";
    SHOAL_FUZZ_CHECK(mkdtemp(templ.data()) != nullptr);
    dir_ = templ;
    root_ = dir_ + "/root";
    class_dir_ = root_ + "/c0";
    SHOAL_FUZZ_CHECK(mkdir(root_.c_str(), 0700) == 0);
    SHOAL_FUZZ_CHECK(mkdir(class_dir_.c_str(), 0700) == 0);
    fd_ = open(Path().c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    SHOAL_FUZZ_CHECK(fd_ >= 0);
  }
  ~InputFolder() {
    close(fd_);
    unlink(Path().c_str());
    rmdir(class_dir_.c_str());
    rmdir(root_.c_str());
    rmdir(dir_.c_str());
  }
  InputFolder(const InputFolder&) = delete;
  InputFolder& operator=(const InputFolder&) = delete;

  // Writes the image as x.jpg or x.png; returns the folder's root.
  const std::string& Write(const uint8_t* data, size_t size, bool jpg) {
    if (jpg != jpg_) {
      const std::string from = Path();
      jpg_ = jpg;
      SHOAL_FUZZ_CHECK(rename(from.c_str(), Path().c_str()) == 0);
    }
    SHOAL_FUZZ_CHECK(ftruncate(fd_, 0) == 0);
    SHOAL_FUZZ_CHECK(pwrite(fd_, data, size, 0) == static_cast<ssize_t>(size));
    return root_;
  }

 private:
  std::string Path() const { return class_dir_ + (jpg_ ? "/x.jpg" : "/x.png"); }

  std::string dir_;
  std::string root_;
  std::string class_dir_;
  bool jpg_ = false;
  int fd_ = -1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static InputFolder folder;
  if (size == 0) return 0;
  shoal::data::ImageFolderOptions options;
  options.height = kSide;
  options.width = kSide;
  options.channels = (data[0] & 2) ? 3 : 1;
  options.classes = {"c0"};
  const std::string& root = folder.Write(data + 1, size - 1, (data[0] & 1) != 0);
  absl::StatusOr<shoal::data::Dataset> loaded = shoal::data::LoadImageFolder(root, options);
  shoal::fuzz::CheckErrorIsClean(loaded.status());
  if (!loaded.ok()) return 0;
  const shoal::data::Dataset& set = *loaded;
  SHOAL_FUZZ_CHECK(set.count == 1);
  SHOAL_FUZZ_CHECK((set.sample_shape == std::vector<int64_t>{options.channels, kSide, kSide}));
  SHOAL_FUZZ_CHECK(set.values.size() == set.count * set.SampleSize());
  SHOAL_FUZZ_CHECK(set.labels.size() == set.count);
  SHOAL_FUZZ_CHECK(set.class_names == options.classes);
  for (uint32_t label : set.labels) SHOAL_FUZZ_CHECK(label < set.class_names.size());
  for (float v : set.values) SHOAL_FUZZ_CHECK(std::isfinite(v) && v >= 0.0f && v <= 1.0f);
  return 0;
}
