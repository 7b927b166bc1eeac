// Model files (ReadModel on an in-memory file). The first input byte chooses repairs: bit 0
// rewrites the layout checksum and bit 1 the value size and digest to match the bytes that
// follow, so that the fuzzer reaches the layout and size checks behind them. A file that reads
// back is re-written and must come out byte for byte the same. MappedModelFile (checkpoints
// served from their mapping) must accept exactly the files ReadModel accepts, with the same
// error code otherwise, and hold the same values.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "libs/tensor/model_file.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

int MemFile(const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  SHOAL_FUZZ_CHECK(fd >= 0);
  return fd;
}

void Replace(int fd, const std::string& bytes) {
  SHOAL_FUZZ_CHECK(ftruncate(fd, 0) == 0);
  SHOAL_FUZZ_CHECK(pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  SHOAL_FUZZ_CHECK(lseek(fd, 0, SEEK_SET) == 0);
}

std::string Contents(int fd) {
  std::string out(static_cast<size_t>(lseek(fd, 0, SEEK_END)), '\0');
  SHOAL_FUZZ_CHECK(pread(fd, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
  return out;
}

// Layout: magic[8] version u32, header_len u32, layout[H], layout digest u64, value bytes u64,
// value digest u64, values (see libs/tensor/model_file.cc).
void Repair(uint8_t how, std::string& file) {
  if (file.size() < 16) return;
  uint32_t header_len = 0;
  std::memcpy(&header_len, file.data() + 12, 4);
  const size_t tail = 16 + static_cast<size_t>(header_len);
  if (tail + 24 > file.size()) return;
  if (how & 1) {
    const uint64_t digest = shoal::tensor::DigestBytes(file.data() + 16, header_len);
    std::memcpy(file.data() + tail, &digest, 8);
  }
  if (how & 2) {
    const uint64_t value_bytes = file.size() - tail - 24;
    const uint64_t digest = shoal::tensor::DigestBytes(file.data() + tail + 24, value_bytes);
    std::memcpy(file.data() + tail + 8, &value_bytes, 8);
    std::memcpy(file.data() + tail + 16, &digest, 8);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int in_fd = MemFile("fuzz-model-in");
  static const int out_fd = MemFile("fuzz-model-out");
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  Repair(data[0], file);
  Replace(in_fd, file);
  absl::StatusOr<shoal::tensor::FlatModel> model = shoal::tensor::ReadModel(in_fd, "fuzz.model");
  shoal::fuzz::CheckErrorIsClean(model.status());
  static const std::string in_path = "/proc/self/fd/" + std::to_string(in_fd);
  auto mapped = shoal::tensor::MappedModelFile::Open(in_path);
  shoal::fuzz::CheckErrorIsClean(mapped.status());
  SHOAL_FUZZ_CHECK(mapped.status().code() == model.status().code());
  if (!model.ok()) return 0;
  SHOAL_FUZZ_CHECK(model->values.size() == model->layout.total_elements());
  SHOAL_FUZZ_CHECK((*mapped)->layout() == model->layout);
  for (size_t t = 0; t < model->layout.num_tensors(); ++t) {
    const absl::string_view bytes = (*mapped)->TensorBytes(t);
    SHOAL_FUZZ_CHECK(bytes.size() == model->layout.tensors()[t].NumElements() * sizeof(float));
    SHOAL_FUZZ_CHECK(bytes.empty() ||
                     std::memcmp(bytes.data(), model->values.data() + model->layout.offset(t),
                                 bytes.size()) == 0);
  }
  Replace(out_fd, "");
  SHOAL_FUZZ_CHECK(shoal::tensor::WriteModel(out_fd, *model, "fuzz.out").ok());
  SHOAL_FUZZ_CHECK(Contents(out_fd) == file);
  return 0;
}
