#include "libs/tensor/model_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/common/escape.h"
#include "libs/common/fd.h"
#include "libs/common/status_macros.h"

namespace shoal::tensor {
namespace {

// File layout (all integers little-endian):
//   char[8]  magic "SHOALMDL"
//   u32      format version (1)
//   u32      header length H (bytes of the layout section below)
//   H bytes  layout: u32 num_tensors; per tensor: u32 name_len, name, u32 ndims, i64 dims[ndims]
//   u64      XXH3-64 of the layout section
//   u64      total value bytes V
//   u64      XXH3-64 of the values (FlatModel::Digest)
//   V bytes  float32 values
constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'M', 'D', 'L'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kMaxHeaderBytes = 64 << 20;
constexpr uint32_t kMaxTensors = 1 << 20;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint32_t kMaxDims = 16;

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(size_t n, std::string* s) {
    if (data_.size() - pos_ < n) return false;
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == data_.size(); }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path,
                      int64_t offset = kAtPosition) {
  if (const int err = WriteFull(fd, data, size, offset); err != 0) {
    errno = err;
    return ErrnoError("cannot write", path);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t size, const std::string& path) {
  const int err = ReadFull(fd, data, size);
  if (err == kEndOfFile) {
    return absl::DataLossError(absl::StrCat("model file ", path, " is truncated"));
  }
  if (err != 0) {
    errno = err;
    return ErrnoError("cannot read", path);
  }
  return absl::OkStatus();
}

// A model file's layout records names and shapes: its values are float32.
absl::Status CheckFloat32(const ModelLayout& layout) {
  for (const TensorSpec& t : layout.tensors()) {
    if (t.element != Element::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", EscapeBytes(t.name),
                                                     "' is not float32: a model file holds "
                                                     "float32 tensors only"));
    }
  }
  return absl::OkStatus();
}

std::string EncodeLayout(const ModelLayout& layout) {
  std::string out;
  Put<uint32_t>(out, static_cast<uint32_t>(layout.num_tensors()));
  for (const TensorSpec& t : layout.tensors()) {
    Put<uint32_t>(out, static_cast<uint32_t>(t.name.size()));
    out.append(t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Put<int64_t>(out, d);
  }
  return out;
}

// Everything before the values.
std::string EncodeHead(const ModelLayout& layout, uint64_t value_digest) {
  std::string encoded = EncodeLayout(layout);
  std::string head(kMagic, sizeof(kMagic));
  Put<uint32_t>(head, kFormatVersion);
  Put<uint32_t>(head, static_cast<uint32_t>(encoded.size()));
  head.append(encoded);
  Put<uint64_t>(head, DigestBytes(encoded.data(), encoded.size()));
  Put<uint64_t>(head, layout.total_bytes());
  Put<uint64_t>(head, value_digest);
  return head;
}

// Makes a rename into `path`'s directory durable.
void SyncDirectoryOf(const std::string& path) {
  std::string dir = ".";
  if (size_t slash = path.rfind('/'); slash != std::string::npos) {
    dir = slash == 0 ? "/" : path.substr(0, slash);
  }
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
}

// Copies `size` bytes from `in` at `from` to `out` at `to`: in the kernel where it can
// (copy_file_range), else through a buffer.
absl::Status CopyRange(int in, uint64_t from, int out, uint64_t to, uint64_t size,
                       const std::string& path) {
  auto in_off = static_cast<off64_t>(from);
  auto out_off = static_cast<off64_t>(to);
  while (size > 0) {
    const ssize_t n = ::copy_file_range(in, &in_off, out, &out_off, size, 0);
    if (n > 0) {
      size -= static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)) {
      if (n == 0) errno = EIO;
      return ErrnoError("cannot copy the values into", path);
    }
    std::string buffer(std::min<uint64_t>(size, 1 << 20), '\0');
    while (size > 0) {
      const size_t chunk = std::min<uint64_t>(size, buffer.size());
      if (const int err = ReadFull(in, buffer.data(), chunk, in_off); err != 0) {
        errno = err == kEndOfFile ? EIO : err;
        return ErrnoError("cannot read back the values for", path);
      }
      SHOAL_RETURN_IF_ERROR(WriteAll(out, buffer.data(), chunk, path));
      in_off += static_cast<off64_t>(chunk);
      size -= chunk;
    }
  }
  return absl::OkStatus();
}

struct FileHeader {
  ModelLayout layout;
  uint64_t value_bytes = 0;
  uint64_t value_digest = 0;
};

absl::StatusOr<FileHeader> ReadHeader(int fd, const std::string& path, uint64_t file_size) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("model file ", path, " is corrupt: ", what));
  };
  char fixed[16];
  if (file_size < sizeof(fixed)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a Shoal model file (too short)"));
  }
  absl::Status s = ReadAll(fd, fixed, sizeof(fixed), path);
  if (!s.ok()) return s;
  if (std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a Shoal model file (bad magic)"));
  }
  uint32_t version, header_len;
  std::memcpy(&version, fixed + 8, 4);
  std::memcpy(&header_len, fixed + 12, 4);
  if (version != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("model file ", path, " has format version ",
                                                   version, "; this build reads version ",
                                                   kFormatVersion));
  }
  if (header_len > kMaxHeaderBytes || sizeof(fixed) + header_len + 24 > file_size) {
    return corrupt("layout section length out of range");
  }
  std::string header(header_len + 24, '\0');
  s = ReadAll(fd, header.data(), header.size(), path);
  if (!s.ok()) return s;
  absl::string_view layout_bytes(header.data(), header_len);
  uint64_t layout_digest, value_bytes, value_digest;
  std::memcpy(&layout_digest, header.data() + header_len, 8);
  std::memcpy(&value_bytes, header.data() + header_len + 8, 8);
  std::memcpy(&value_digest, header.data() + header_len + 16, 8);
  if (DigestBytes(layout_bytes.data(), layout_bytes.size()) != layout_digest) {
    return corrupt("layout checksum mismatch");
  }
  Reader r(layout_bytes);
  uint32_t num_tensors;
  if (!r.Get(&num_tensors) || num_tensors > kMaxTensors) return corrupt("bad tensor count");
  // An entry takes at least its name length and dimension count: a count the section cannot
  // hold is refused before anything is allocated for it (a few bytes must not cost megabytes).
  if (num_tensors > r.remaining() / (2 * sizeof(uint32_t))) {
    return corrupt(absl::StrCat(num_tensors, " tensors cannot fit in a layout section of ",
                                header_len, " bytes"));
  }
  std::vector<TensorSpec> specs(num_tensors);
  for (TensorSpec& t : specs) {
    uint32_t name_len, ndims;
    if (!r.Get(&name_len) || name_len > kMaxNameBytes || !r.GetString(name_len, &t.name) ||
        !r.Get(&ndims) || ndims > kMaxDims) {
      return corrupt("bad tensor entry");
    }
    t.shape.resize(ndims);
    for (int64_t& d : t.shape) {
      if (!r.Get(&d)) return corrupt("bad tensor shape");
    }
  }
  if (!r.done()) return corrupt("trailing bytes in the layout section");
  auto layout = ModelLayout::Create(std::move(specs));
  if (!layout.ok()) return corrupt(layout.status().message());
  if (value_bytes != layout->total_bytes()) return corrupt("value size does not match the layout");
  if (sizeof(fixed) + header_len + 24 + value_bytes != file_size) {
    return corrupt(absl::StrCat("file is ", file_size, " bytes, expected ",
                                sizeof(fixed) + header_len + 24 + value_bytes));
  }
  return FileHeader{*std::move(layout), value_bytes, value_digest};
}

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

absl::Status WriteModel(int fd, const FlatModel& model, const std::string& what) {
  SHOAL_RETURN_IF_ERROR(CheckFloat32(model.layout));
  if (model.values.size() != model.layout.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", model.values.size(),
                                                   " values but its layout needs ",
                                                   model.layout.total_elements()));
  }
  const std::string head = EncodeHead(model.layout, model.Digest());
  SHOAL_RETURN_IF_ERROR(WriteAll(fd, head.data(), head.size(), what));
  return WriteAll(fd, reinterpret_cast<const char*>(model.values.data()),
                  model.values.size() * sizeof(float), what);
}

namespace {

constexpr absl::string_view kWriteTemporary = ".tmp.";     // WriteModelFile's: PATH.tmp.PID
constexpr absl::string_view kWriterTemporary = ".model-";  // ModelFileWriter's (mkostemp)
constexpr size_t kWriterRandom = 6;                        // the XXXXXX

// mkostemp's template for a writer's temporary file in `dir` (IsUnfinishedModelWrite knows it).
std::string WriterTemplate(absl::string_view dir) {
  return absl::StrCat(dir, "/", kWriterTemporary, std::string(kWriterRandom, 'X'));
}

// The process's file mode creation mask, read where it does not change it (/proc/self/status,
// Linux 4.7 on; else the usual 022): mkostemp makes its files 0600, and a model file a writer
// commits gets the mode an open() with 0644 would have given it, as WriteModelFile's does.
mode_t ProcessUmask() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return 022;
  unsigned mask = 022;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
  }
  std::fclose(f);
  return static_cast<mode_t>(mask);
}

}  // namespace

bool IsUnfinishedModelWrite(absl::string_view file_name) {
  if (absl::StartsWith(file_name, kWriterTemporary)) {
    return file_name.size() == kWriterTemporary.size() + kWriterRandom;
  }
  const size_t at = file_name.rfind(kWriteTemporary);
  if (at == absl::string_view::npos || at == 0) return false;
  const absl::string_view pid = file_name.substr(at + kWriteTemporary.size());
  return !pid.empty() && std::all_of(pid.begin(), pid.end(), absl::ascii_isdigit);
}

absl::Status WriteModelFile(const std::string& path, const FlatModel& model) {
  const std::string tmp = absl::StrCat(path, kWriteTemporary, ::getpid());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError("cannot create", tmp);
  absl::Status s = WriteModel(fd.get(), model, tmp);
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoError("cannot fsync", tmp);
  if (s.ok() && ::close(fd.release()) != 0) s = ErrnoError("cannot close", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError("cannot rename to", path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  SyncDirectoryOf(path);
  return absl::OkStatus();
}

uint64_t ModelFileValuesOffset(const ModelLayout& layout) { return EncodeHead(layout, 0).size(); }

absl::StatusOr<std::unique_ptr<ModelFileWriter>> ModelFileWriter::Create(const std::string& dir,
                                                                         uint64_t values_offset) {
  std::string name = WriterTemplate(dir);
  Fd fd(::mkostemp(name.data(), O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot create a temporary model file in", dir);
  std::unique_ptr<ModelFileWriter> writer(new ModelFileWriter());
  writer->tmp_ = std::move(name);
  writer->fd_ = std::move(fd);
  writer->values_offset_ = values_offset;
  writer->values_ = std::make_unique<DirectWriter>(writer->fd_.get(), values_offset);
  // Values whose place is not known (Commit copies them behind the header) go through the page
  // cache, where the copy finds them: written around it, the copy would read them back from the
  // device, and the file would cross the disk twice.
  if (values_offset == 0) writer->values_->Finish();
  writer->digest_ = XXH3_createState();
  XXH3_64bits_reset(writer->digest_);
  return writer;
}

ModelFileWriter::~ModelFileWriter() {
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  if (digest_ != nullptr) XXH3_freeState(digest_);
}

absl::Status ModelFileWriter::Write(size_t first, absl::Span<const float> values) {
  if (first != written_) {
    return absl::FailedPreconditionError(
        absl::StrCat("model values arrive out of order: ", first, " after ", written_, " values"));
  }
  const size_t bytes = values.size() * sizeof(float);
  if (const int err = values_->Append(values.data(), bytes); err != 0) {
    errno = err;
    return ErrnoError("cannot write", tmp_);
  }
  XXH3_64bits_update(digest_, values.data(), bytes);
  written_ += values.size();
  return absl::OkStatus();
}

uint64_t ModelFileWriter::digest() const { return XXH3_64bits_digest(digest_); }

absl::Status ModelFileWriter::Commit(const ModelLayout& layout, const std::string& path) {
  if (committed_) return absl::FailedPreconditionError("the model file is already committed");
  SHOAL_RETURN_IF_ERROR(CheckFloat32(layout));
  if (written_ != layout.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model file got ", written_, " values but its layout needs ", layout.total_elements()));
  }
  if (const int err = values_->Finish(); err != 0) {
    errno = err;
    return ErrnoError("cannot write", tmp_);
  }
  const std::string head = EncodeHead(layout, digest());
  if (head.size() == values_offset_) {
    SHOAL_RETURN_IF_ERROR(WriteAll(fd_.get(), head.data(), head.size(), tmp_, 0));
  } else {
    // The values are elsewhere: a second file gets the header and the values behind it, named
    // as the first (IsUnfinishedModelWrite knows it if a crash leaves it).
    std::string name = WriterTemplate(absl::string_view(tmp_).substr(0, tmp_.rfind('/')));
    Fd out(::mkostemp(name.data(), O_CLOEXEC));
    if (out.get() < 0) return ErrnoError("cannot create", name);
    absl::Status s = WriteAll(out.get(), head.data(), head.size(), name, 0);
    if (s.ok()) {
      s = CopyRange(fd_.get(), values_offset_, out.get(), head.size(), layout.total_bytes(), name);
    }
    if (!s.ok()) {
      ::unlink(name.c_str());
      return s;
    }
    ::unlink(tmp_.c_str());
    tmp_ = std::move(name);
    fd_ = std::move(out);
  }
  if (::fchmod(fd_.get(), 0644 & ~ProcessUmask()) != 0) return ErrnoError("cannot chmod", tmp_);
  if (::fsync(fd_.get()) != 0) return ErrnoError("cannot fsync", tmp_);
  if (::close(fd_.release()) != 0) return ErrnoError("cannot close", tmp_);
  if (::rename(tmp_.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  committed_ = true;
  SyncDirectoryOf(path);
  return absl::OkStatus();
}

absl::StatusOr<FlatModel> ReadModel(int fd, const std::string& what) {
  auto size = FileSize(fd, what);
  if (!size.ok()) return size.status();
  auto header = ReadHeader(fd, what, *size);
  if (!header.ok()) return header.status();
  FlatModel model;
  model.layout = std::move(header->layout);
  model.values.resize(model.layout.total_elements());
  absl::Status s =
      ReadAll(fd, reinterpret_cast<char*>(model.values.data()), header->value_bytes, what);
  if (!s.ok()) return s;
  if (model.Digest() != header->value_digest) {
    return absl::DataLossError(
        absl::StrCat("model file ", what, " is corrupt: value digest mismatch"));
  }
  return model;
}

absl::StatusOr<FlatModel> ReadModelFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open model file", path);
  return ReadModel(fd.get(), path);
}

absl::StatusOr<std::shared_ptr<const MappedModelFile>> MappedModelFile::Open(
    const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open model file", path);
  SHOAL_ASSIGN_OR_RETURN(const uint64_t size, FileSize(fd.get(), path));
  SHOAL_ASSIGN_OR_RETURN(FileHeader header, ReadHeader(fd.get(), path, size));
  std::shared_ptr<MappedModelFile> file(new MappedModelFile());
  file->layout_ = std::move(header.layout);
  file->map_bytes_ = static_cast<size_t>(size);
  void* map = ::mmap(nullptr, file->map_bytes_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return ErrnoError("cannot map", path);
  file->map_ = map;
  ::madvise(map, file->map_bytes_, MADV_SEQUENTIAL);
  // The values are the file's last bytes (ReadHeader checked the exact size).
  file->values_ = static_cast<const char*>(map) + (size - header.value_bytes);
  if (DigestBytes(file->values_, header.value_bytes) != header.value_digest) {
    return absl::DataLossError(
        absl::StrCat("model file ", path, " is corrupt: value digest mismatch"));
  }
  return std::shared_ptr<const MappedModelFile>(std::move(file));
}

MappedModelFile::~MappedModelFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

absl::string_view MappedModelFile::TensorBytes(size_t t) const {
  return absl::string_view(values_ + layout_.offset(t) * sizeof(float),
                           static_cast<size_t>(layout_.tensors()[t].NumElements()) * sizeof(float));
}

}  // namespace shoal::tensor
