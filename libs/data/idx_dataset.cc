#include "libs/data/idx_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"
#include "libs/common/status_macros.h"

namespace shoal::data {
namespace {

// Decompressed bytes handed over per read: large enough that zlib calls do not dominate. A
// multiple of every element size, so no element straddles two blocks.
constexpr size_t kReadBlockBytes = size_t{1} << 20;
// zlib's input buffer (its default of 8 KiB makes many small read(2) calls).
constexpr unsigned kGzBufferBytes = 128u << 10;
// Values reserved before any data has arrived: a short (or tiny gzip) file whose header claims
// gigabytes must not allocate them. Past this the vector grows as the data really comes in.
constexpr size_t kInitialReserve = size_t{16} << 20;
// Long enough for real paths: EscapeBytes' default would cut the file name off a deep path.
constexpr size_t kMaxPathChars = 4096;

constexpr uint8_t kUint8 = 0x08;
constexpr uint8_t kInt8 = 0x09;
constexpr uint8_t kInt16 = 0x0B;
constexpr uint8_t kInt32 = 0x0C;
constexpr uint8_t kFloat32 = 0x0D;
constexpr uint8_t kFloat64 = 0x0E;

// Bytes per element of `type`; 0 for a type IDX does not define.
size_t ElementBytes(uint8_t type) {
  switch (type) {
    case kUint8:
    case kInt8:
      return 1;
    case kInt16:
      return 2;
    case kInt32:
    case kFloat32:
      return 4;
    case kFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* TypeName(uint8_t type) {
  switch (type) {
    case kUint8:
      return "uint8";
    case kInt8:
      return "int8";
    case kInt16:
      return "int16";
    case kInt32:
      return "int32";
    case kFloat32:
      return "float32";
    default:
      return "float64";
  }
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

uint64_t BigEndian64(const uint8_t* p) {
  return (uint64_t{BigEndian32(p)} << 32) | BigEndian32(p + 4);
}

// The element at `p` as a double (exact for every IDX type).
double Element(uint8_t type, const uint8_t* p) {
  switch (type) {
    case kUint8:
      return p[0];
    case kInt8:
      return static_cast<int8_t>(p[0]);
    case kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>((p[0] << 8) | p[1]));
    case kInt32:
      return static_cast<int32_t>(BigEndian32(p));
    case kFloat32:
      return std::bit_cast<float>(BigEndian32(p));
    default:
      return std::bit_cast<double>(BigEndian64(p));
  }
}

absl::Status ErrnoError(int err, const std::string& shown, absl::string_view verb) {
  const std::string msg =
      absl::StrCat(shown, ": cannot ", verb, " the IDX file: ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Reserves room for `more` values beyond the size, growing geometrically but never past
// `total`, the count the header declares: the vector ends at its exact size instead of the
// up-to-2x slack of push_back's growth (60,000 Fashion-MNIST images are 188 MB of floats).
template <typename T>
void GrowFor(std::vector<T>& v, size_t more, size_t total) {
  const size_t needed = v.size() + more;
  if (needed <= v.capacity()) return;
  v.reserve(std::min(total, std::max({needed, 2 * v.capacity(), kInitialReserve})));
}

// One IDX file opened and its header read; ReadData then streams the data. Owns the zlib
// handle. Used by one thread at a time.
class IdxFile {
 public:
  static absl::StatusOr<std::unique_ptr<IdxFile>> Open(const std::string& path,
                                                       uint64_t max_bytes) {
    const std::string shown = EscapeBytes(path, kMaxPathChars);
    // open + fstat + gzdopen rather than stat + gzopen: the file checked is the file read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, shown, "open");
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, shown, "read");
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(shown, ": is a directory, not an IDX file"));
    }
    gzFile file = gzdopen(fd, "rb");
    if (file == nullptr) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(shown, ": cannot open the IDX file: out of memory"));
    }
    gzbuffer(file, kGzBufferBytes);
    std::unique_ptr<IdxFile> idx(new IdxFile(shown, file));
    SHOAL_RETURN_IF_ERROR(idx->ReadHeader(max_bytes));
    return idx;
  }

  ~IdxFile() { gzclose(file_); }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  const std::string& shown() const { return shown_; }
  uint8_t type() const { return type_; }
  const std::vector<uint32_t>& dims() const { return dims_; }
  uint64_t elements() const { return elements_; }
  bool is_integer() const {
    return type_ == kUint8 || type_ == kInt8 || type_ == kInt16 || type_ == kInt32;
  }

  // Calls consume(first_element, bytes, elements) for each block of the data in order, then
  // checks that nothing follows it. consume returns a Status; the first error stops the read.
  template <typename Consume>
  absl::Status ReadData(Consume consume) {
    const size_t element_bytes = ElementBytes(type_);
    const uint64_t expected = elements_ * element_bytes;
    std::vector<uint8_t> block(static_cast<size_t>(std::min<uint64_t>(kReadBlockBytes, expected)));
    uint64_t done = 0;
    while (done < expected) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(block.size(), expected - done));
      SHOAL_ASSIGN_OR_RETURN(const size_t got, Read(block.data(), want));
      const size_t whole = got - got % element_bytes;
      if (whole > 0) {
        SHOAL_RETURN_IF_ERROR(consume(done / element_bytes, block.data(), whole / element_bytes));
      }
      done += got;
      if (got < want) {
        return absl::InvalidArgumentError(
            absl::StrCat(shown_, ": the data is truncated: the header (", DescribeShape(),
                         ") declares ", expected, " data bytes, found ", done, CutShortNote()));
      }
    }
    return CheckEnd(expected);
  }

 private:
  IdxFile(std::string shown, gzFile file) : shown_(std::move(shown)), file_(file) {}

  std::string DescribeShape() const {
    return absl::StrCat(TypeName(type_), " [", absl::StrJoin(dims_, ", "), "]");
  }

  // Up to `n` bytes; fewer only at the end of the data.
  absl::StatusOr<size_t> Read(uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      const int r = gzread(file_, out + got, static_cast<unsigned>(n - got));
      if (r < 0) {
        int errnum = 0;
        const char* what = gzerror(file_, &errnum);
        if (errnum == Z_ERRNO) return ErrnoError(errno, shown_, "read");
        return absl::InvalidArgumentError(
            absl::StrCat(shown_, ": corrupt gzip data: ", what ? what : "unknown zlib error"));
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  // zlib returns what a cut-off gzip stream held and flags Z_BUF_ERROR; saying so tells a
  // truncated download apart from a wrong header.
  std::string CutShortNote() {
    int errnum = 0;
    gzerror(file_, &errnum);
    return errnum == Z_BUF_ERROR ? " (the gzip stream ends early)" : "";
  }

  absl::Status ReadHeader(uint64_t max_bytes) {
    uint8_t magic[4];
    SHOAL_ASSIGN_OR_RETURN(size_t got, Read(magic, sizeof magic));
    if (got < sizeof magic) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown_, ": the IDX header is truncated: expected 4 magic bytes, found ", got,
                       CutShortNote()));
    }
    if (magic[0] != 0 || magic[1] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown_, ": bad magic ", absl::Hex(BigEndian32(magic), absl::kZeroPad8),
                       ": not an IDX file (expected 00 00 <type> <dimensions>)"));
    }
    type_ = magic[2];
    if (ElementBytes(type_) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          shown_, ": unsupported IDX element type 0x", absl::Hex(type_, absl::kZeroPad2),
          " (supported: 08 uint8, 09 int8, 0B int16, 0C int32, 0D float32, 0E float64)"));
    }
    const size_t ndims = magic[3];
    if (ndims == 0) {
      return absl::InvalidArgumentError(absl::StrCat(shown_, ": the IDX header has 0 dimensions"));
    }
    std::vector<uint8_t> raw(4 * ndims);
    SHOAL_ASSIGN_OR_RETURN(got, Read(raw.data(), raw.size()));
    if (got < raw.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown_, ": the IDX header is truncated: expected ", 4 + raw.size(),
                       " bytes for ", ndims, " dimensions, found ", 4 + got, CutShortNote()));
    }
    dims_.resize(ndims);
    uint64_t elements = 1;
    bool overflow = false;
    for (size_t i = 0; i < ndims; ++i) dims_[i] = BigEndian32(&raw[4 * i]);
    for (size_t i = 0; i < ndims; ++i) {
      if (dims_[i] == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(shown_, ": dimension ", i, " of ", DescribeShape(), " is 0"));
      }
      overflow = overflow || __builtin_mul_overflow(elements, dims_[i], &elements);
    }
    uint64_t data_bytes = 0;
    overflow = overflow || __builtin_mul_overflow(elements, ElementBytes(type_), &data_bytes);
    const uint64_t header_bytes = 4 + raw.size();
    if (overflow || data_bytes > max_bytes || max_bytes - data_bytes < header_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown_, ": the header declares ", DescribeShape(), ": ",
                       overflow ? std::string("more bytes than 64 bits count")
                                : DescribeBytes(static_cast<size_t>(header_bytes + data_bytes)),
                       ", over the limit of ", DescribeBytes(static_cast<size_t>(max_bytes))));
    }
    elements_ = elements;
    return absl::OkStatus();
  }

  // After `data_bytes` of data the file must end: trailing bytes mean the header is wrong (or
  // the file is two files), and either way the samples cannot be trusted.
  absl::Status CheckEnd(uint64_t data_bytes) {
    std::vector<uint8_t> rest(kReadBlockBytes);
    SHOAL_ASSIGN_OR_RETURN(const size_t got, Read(rest.data(), rest.size()));
    if (got == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        shown_, ": ", got == rest.size() ? "more than " : "", got, " bytes follow the ", data_bytes,
        " data bytes that the header (", DescribeShape(), ") declares"));
  }

  std::string shown_;
  gzFile file_;
  uint8_t type_ = 0;
  std::vector<uint32_t> dims_;
  uint64_t elements_ = 0;
};

absl::Status ValidateOptions(const std::string& labels_shown, const IdxOptions& options) {
  const auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(labels_shown, ": IdxOptions: ", parts...));
  };
  if (options.num_classes > kMaxIdxClasses) {
    return bad("num_classes ", options.num_classes, " is over the limit of ", kMaxIdxClasses);
  }
  if (options.classes.size() > kMaxIdxClasses) {
    return bad(options.classes.size(), " classes, over the limit of ", kMaxIdxClasses);
  }
  if (!options.classes.empty() && options.num_classes != 0 &&
      options.num_classes != options.classes.size()) {
    return bad("num_classes ", options.num_classes, " does not match the ", options.classes.size(),
               " classes given");
  }
  return absl::OkStatus();
}

// The images' data as floats: uint8 scaled to [0, 1], the rest as they are, every value finite.
absl::Status ReadImages(IdxFile& images, uint64_t sample_size, std::vector<float>& values) {
  const uint8_t type = images.type();
  const size_t element_bytes = ElementBytes(type);
  const size_t total = static_cast<size_t>(images.elements());
  values.reserve(std::min(total, kInitialReserve));
  return images.ReadData([&](uint64_t first, const uint8_t* data, size_t n) -> absl::Status {
    GrowFor(values, n, total);
    if (type == kUint8) {  // the common case (MNIST-like images), kept free of per-value checks
      for (size_t i = 0; i < n; ++i) values.push_back(static_cast<float>(data[i]) / 255.0f);
      return absl::OkStatus();
    }
    for (size_t i = 0; i < n; ++i) {
      const double v = Element(type, data + i * element_bytes);
      // A float64 past float32's range would silently become infinity.
      if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(images.shown(), ": sample ", (first + i) / sample_size, " holds ", v,
                         std::isfinite(v) ? ", outside float32's range" : ", not a finite number"));
      }
      values.push_back(static_cast<float>(v));
    }
    return absl::OkStatus();
  });
}

// The labels, each checked against `limit` (the class count, or kMaxIdxClasses when it comes
// from the labels themselves).
absl::Status ReadLabels(IdxFile& labels, uint32_t limit, bool limit_is_cap,
                        std::vector<uint32_t>& out) {
  const uint8_t type = labels.type();
  const size_t element_bytes = ElementBytes(type);
  const size_t total = static_cast<size_t>(labels.elements());
  out.reserve(std::min(total, kInitialReserve));
  return labels.ReadData([&](uint64_t first, const uint8_t* data, size_t n) -> absl::Status {
    GrowFor(out, n, total);
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(Element(type, data + i * element_bytes));
      if (v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(labels.shown(), ": label ", v, " of sample ", first + i, " is negative"));
      }
      if (v >= limit) {
        return absl::InvalidArgumentError(
            absl::StrCat(labels.shown(), ": label ", v, " of sample ", first + i,
                         limit_is_cap ? " is over the limit of " : " is not below the class count ",
                         limit, limit_is_cap ? " classes" : ""));
      }
      out.push_back(static_cast<uint32_t>(v));
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path,
                                const IdxOptions& options) {
  SHOAL_RETURN_IF_ERROR(ValidateOptions(EscapeBytes(labels_path, kMaxPathChars), options));
  // Both headers first, so that a mismatch is found before tens of megabytes are decompressed.
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<IdxFile> images,
                         IdxFile::Open(images_path, options.max_bytes));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<IdxFile> labels,
                         IdxFile::Open(labels_path, options.max_bytes));
  if (labels->dims().size() != 1 || !labels->is_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels->shown(),
                     ": a labels file holds one dimension of integers (uint8, int8, int16 or "
                     "int32); this one has ",
                     labels->dims().size(), " dimensions of ", TypeName(labels->type())));
  }
  const uint64_t count = images->dims()[0];
  if (labels->dims()[0] != count) {
    return absl::InvalidArgumentError(absl::StrCat(labels->shown(), ": ", labels->dims()[0],
                                                   " labels for the ", count, " samples of ",
                                                   images->shown()));
  }

  Dataset out;
  out.count = static_cast<size_t>(count);
  const std::vector<uint32_t>& dims = images->dims();
  if (dims.size() == 1) {
    out.sample_shape = {1};
  } else if (dims.size() == 3) {
    out.sample_shape = {1, dims[1], dims[2]};
  } else {
    out.sample_shape.assign(dims.begin() + 1, dims.end());
  }
  SHOAL_RETURN_IF_ERROR(ReadImages(*images, images->elements() / count, out.values));

  const uint32_t known_classes =
      options.num_classes > 0 ? options.num_classes : static_cast<uint32_t>(options.classes.size());
  SHOAL_RETURN_IF_ERROR(ReadLabels(*labels, known_classes > 0 ? known_classes : kMaxIdxClasses,
                                   /*limit_is_cap=*/known_classes == 0, out.labels));
  uint32_t classes = known_classes;
  if (classes == 0) classes = *std::max_element(out.labels.begin(), out.labels.end()) + 1;

  if (options.classes.empty()) {
    out.class_names.reserve(classes);
    for (uint32_t c = 0; c < classes; ++c) out.class_names.push_back(absl::StrCat(c));
  } else {
    out.class_names = options.classes;
  }
  return out;
}

}  // namespace shoal::data
