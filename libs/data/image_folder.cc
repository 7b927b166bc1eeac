#include "libs/data/image_folder.h"

// Debian's libstb.so already holds the implementations (built with no optional macros), so
// STB_IMAGE_IMPLEMENTATION and friends must not be defined here.
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"
#include "libs/common/status_macros.h"

namespace shoal::data {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxSide = 4096;
// A small compressed file can declare a huge canvas (a PNG of zeros compresses about 1000:1), so
// the decoded size is capped from the header before stb allocates it: 256 MiB is a 9000 x 9000
// RGB photo, far past what a resize to at most 4096 x 4096 needs.
constexpr uint64_t kMaxDecodedBytes = uint64_t{1} << 28;
// Long enough for real paths: EscapeBytes' default would cut the file name off a deep path.
constexpr size_t kMaxPathChars = 4096;
// Class directories named in a "found:" list; a folder of thousands would drown the message.
constexpr size_t kMaxListedNames = 20;

std::string Show(const fs::path& path) { return EscapeBytes(path.string(), kMaxPathChars); }

absl::Status IoError(const fs::path& path, absl::string_view verb, const std::error_code& ec) {
  const std::string msg = absl::StrCat(Show(path), ": cannot ", verb, ": ", ec.message());
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
    return absl::NotFoundError(msg);
  }
  if (ec == std::errc::permission_denied || ec == std::errc::operation_not_permitted) {
    return absl::PermissionDeniedError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status BadOption(const std::string& dir, absl::string_view option, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(Show(dir), ": ImageFolderOptions.", option, " ", what));
}

absl::Status CheckPerChannel(const std::string& dir, absl::string_view option,
                             const std::vector<float>& values, int channels, bool positive) {
  if (values.empty()) return absl::OkStatus();
  if (values.size() != static_cast<size_t>(channels)) {
    return BadOption(dir, option,
                     absl::StrCat("has ", values.size(), " values; expected none or ", channels,
                                  " (one per channel)"));
  }
  for (size_t c = 0; c < values.size(); ++c) {
    if (!std::isfinite(values[c]) || (positive && values[c] <= 0)) {
      return BadOption(
          dir, absl::StrCat(option, "[", c, "]"),
          absl::StrCat("is ", values[c], "; expected a finite number", positive ? " > 0" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const std::string& dir, const ImageFolderOptions& options) {
  for (auto [name, value] :
       {std::pair{"height", options.height}, std::pair{"width", options.width}}) {
    if (value < 1 || value > kMaxSide) {
      return BadOption(dir, name, absl::StrCat("is ", value, "; expected 1..", kMaxSide));
    }
  }
  if (options.channels != 1 && options.channels != 3) {
    return BadOption(dir, "channels",
                     absl::StrCat("is ", options.channels, "; expected 1 (grayscale) or 3 (RGB)"));
  }
  SHOAL_RETURN_IF_ERROR(CheckPerChannel(dir, "mean", options.mean, options.channels, false));
  SHOAL_RETURN_IF_ERROR(CheckPerChannel(dir, "std", options.std, options.channels, true));
  if (options.max_image_bytes < 1 || options.max_image_bytes > INT_MAX) {
    return BadOption(dir, "max_image_bytes",
                     absl::StrCat("is ", options.max_image_bytes, "; expected 1..", INT_MAX));
  }
  if (options.max_images < 1) return BadOption(dir, "max_images", "is 0; expected at least 1");
  std::set<absl::string_view> seen;
  for (size_t i = 0; i < options.classes.size(); ++i) {
    const std::string& name = options.classes[i];
    const std::string option = absl::StrCat("classes[", i, "]");
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      return BadOption(dir, option,
                       absl::StrCat("is ", QuoteBytes(name), "; expected a directory name"));
    }
    if (!seen.insert(name).second) {
      return BadOption(dir, option, absl::StrCat("repeats ", QuoteBytes(name)));
    }
  }
  return absl::OkStatus();
}

// Dotfiles are editor, OS and VCS litter (.DS_Store, .git, ._photo.jpg from macOS), never data.
bool IsHidden(const std::string& name) { return !name.empty() && name[0] == '.'; }

bool HasImageExtension(const fs::path& name) {
  const std::string ext = absl::AsciiStrToLower(name.extension().string());
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

struct Listing {
  std::vector<std::string> names;  // sorted bytewise
  uint64_t skipped = 0;
};

// The entries of `dir` that `keep` accepts, by name; the others are counted as skipped.
// `keep(name, is_directory, is_regular_file)`.
template <typename Keep>
absl::StatusOr<Listing> ListDirectory(const fs::path& dir, Keep keep) {
  Listing listing;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return IoError(dir, "list the directory", ec);
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;  // a dangling link is neither kind: skipped, not an error
    const bool is_dir = it->is_directory(type_ec);
    const bool is_file = it->is_regular_file(type_ec);
    if (keep(name, is_dir, is_file)) {
      listing.names.push_back(name);
    } else {
      ++listing.skipped;
    }
  }
  if (ec) return IoError(dir, "list the directory", ec);
  // std::string compares as unsigned char: bytewise, the same on every peer whatever its locale.
  std::sort(listing.names.begin(), listing.names.end());
  return listing;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < kMaxListedNames; ++i) {
    shown.push_back(QuoteBytes(names[i]));
  }
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxListedNames) absl::StrAppend(&out, ", ... (", names.size(), " in all)");
  return out;
}

// The class directories in label order.
absl::StatusOr<std::vector<std::string>> FindClasses(const fs::path& root,
                                                     const ImageFolderOptions& options,
                                                     uint64_t& skipped) {
  SHOAL_ASSIGN_OR_RETURN(Listing found,
                         ListDirectory(root, [](const std::string& name, bool is_dir, bool) {
                           return is_dir && !IsHidden(name);
                         }));
  skipped += found.skipped;
  if (found.names.empty()) {
    return absl::NotFoundError(absl::StrCat(
        Show(root), ": no class directories (expected one subdirectory of images per class)"));
  }
  if (options.classes.empty()) return std::move(found.names);
  const std::set<absl::string_view> wanted(options.classes.begin(), options.classes.end());
  for (const std::string& name : options.classes) {
    if (!options.allow_missing_classes &&
        !std::binary_search(found.names.begin(), found.names.end(), name)) {
      return absl::NotFoundError(
          absl::StrCat(Show(root / name), ": no directory for class ", QuoteBytes(name),
                       " of ImageFolderOptions.classes; the class directories found are ",
                       JoinNames(found.names)));
    }
  }
  for (const std::string& name : found.names) {
    if (!wanted.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Show(root / name), ": directory ", QuoteBytes(name),
          " is not a class of ImageFolderOptions.classes (", JoinNames(options.classes), ")"));
    }
  }
  return options.classes;
}

std::string DescribeChannels(int channels) {
  switch (channels) {
    case 1:
      return "1 channel (grayscale)";
    case 2:
      return "2 channels (grayscale with alpha)";
    case 3:
      return "3 channels (RGB)";
    case 4:
      return "4 channels (RGB with alpha)";
    default:
      return absl::StrCat(channels, " channels");
  }
}

// stb's reason for the last failure, escaped: for an unknown PNG chunk it holds the chunk's four
// type bytes from the file, raw.
std::string FailureReason() {
  const char* reason = stbi_failure_reason();
  return EscapeBytes(reason != nullptr ? reason : "unknown error");
}

// The whole of `path` if it holds at most `max_bytes`. Not ReadSmallFile: that one sizes its
// buffer to the cap, which for images (64 MiB by default) would cost a 64 MiB clear per file.
absl::StatusOr<std::string> ReadImageFile(const fs::path& path, uint64_t max_bytes) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    // filebuf opens with fopen, which sets errno; a stream that failed otherwise reads as EIO.
    const int err = errno != 0 ? errno : EIO;
    return IoError(path, "open the image", std::error_code(err, std::generic_category()));
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (!ec && size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(Show(path), ": the image is ",
                                                   DescribeBytes(size), ", over the limit of ",
                                                   DescribeBytes(max_bytes)));
  }
  // Read one byte past the cap, so that a file that grew since it was measured is still bounded.
  std::string bytes(ec ? max_bytes + 1 : size + 1, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.bad()) {
    return IoError(path, "read the image", std::make_error_code(std::errc::io_error));
  }
  const uint64_t got = static_cast<uint64_t>(in.gcount());
  if (got > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(path), ": the image is over the limit of ", DescribeBytes(max_bytes)));
  }
  bytes.resize(got);
  return bytes;
}

struct StbiFree {
  void operator()(unsigned char* pixels) const { stbi_image_free(pixels); }
};

struct Pixels {
  std::vector<unsigned char> interleaved;  // height x width x channels
  bool resized = false;
};

// stb_image 2.27 (Debian bookworm's libstb) builds a JPEG Huffman table from the 16 code
// counts of a DHT segment without checking that they add up to at most 256, and writes past the
// table's 256 entries when they do not (stb issues #1289 and #1291). Such a table is corrupt, so
// every table that stb could reach is checked here first. The walk mirrors stb's: length-prefixed
// segments are skipped whole, and after a scan header the entropy-coded data runs to the next
// marker (0xFF then a byte other than 0x00, 0xFF or a restart marker). It may look at more
// tables than stb would (stb stops at its first error), never at fewer. stb 2.27 also decodes a
// scan with a Huffman table that no DHT segment defined before it, reading its uninitialised
// memory as the table (an index far out of bounds: found by the image_folder fuzz target), so
// each scan's tables are checked to be defined, those that stb would use for it: in a
// progressive image a first DC scan its DC tables and an AC scan its AC tables, otherwise both.
absl::Status CheckJpegHuffmanTables(const fs::path& path, const std::string& bytes) {
  const auto at = [&bytes](size_t i) -> uint32_t {
    return i < bytes.size() ? static_cast<unsigned char>(bytes[i]) : 0;  // stb reads 0 past end
  };
  size_t pos = 2;  // after SOI
  bool in_scan = false;
  bool progressive = false;
  bool defined[2][4] = {};  // [DC, AC][table id]
  while (pos < bytes.size()) {
    // The next marker: 0xFF, any 0xFF fill bytes, then the marker byte.
    if (at(pos) != 0xFF) {
      ++pos;
      continue;
    }
    size_t m = pos + 1;
    while (m < bytes.size() && at(m) == 0xFF) ++m;
    if (m >= bytes.size()) break;
    const uint32_t marker = at(m);
    pos = m + 1;
    if (in_scan && (marker == 0x00 || (marker >= 0xD0 && marker <= 0xD7))) continue;
    in_scan = false;
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9)) break;
    const uint32_t length = (at(pos) << 8) | at(pos + 1);
    if (length < 2) break;
    if (marker == 0xC4) {
      size_t table = pos + 2;
      for (int64_t left = int64_t{length} - 2; left > 0;) {
        if ((at(table) >> 4) <= 1 && (at(table) & 15) <= 3) {
          defined[at(table) >> 4][at(table) & 15] = true;  // stb refuses other ids
        }
        uint32_t codes = 0;
        for (size_t i = 1; i <= 16; ++i) codes += at(table + i);
        if (codes > 256) {
          return absl::InvalidArgumentError(
              absl::StrCat(Show(path), ": corrupt JPEG image: a Huffman table declares ", codes,
                           " codes, more than 256"));
        }
        table += 17 + codes;
        left -= 17 + codes;
      }
    }
    if (marker == 0xC2) progressive = true;
    if (marker == 0xDA) {
      const uint32_t components = at(pos + 2);
      const uint32_t first = at(pos + 3 + 2 * components),
                     refine = at(pos + 5 + 2 * components) >> 4;
      const bool dc = !progressive || (first == 0 && refine == 0), ac = !progressive || first > 0;
      for (uint32_t c = 0; c < components; ++c) {
        const uint32_t tables = at(pos + 4 + 2 * c);
        if ((dc && (tables >> 4) <= 3 && !defined[0][tables >> 4]) ||
            (ac && (tables & 15) <= 3 && !defined[1][tables & 15])) {
          return absl::InvalidArgumentError(absl::StrCat(
              Show(path), ": corrupt JPEG image: a scan uses a Huffman table that is not defined"));
        }
      }
    }
    in_scan = marker == 0xDA;
    pos += length;
  }
  return absl::OkStatus();
}

// stb_image 2.27 grows its buffer for a PNG's IDAT data to the length a chunk declares (doubling
// up to 2^31 bytes) before it reads the chunk, so a file of a few hundred bytes can make it
// allocate 2 GiB (found by the image_folder fuzz target). A chunk whose declared data does not
// fit in what is left of the file is corrupt: refused here, before stb sees it. The walk stops
// at IEND (stb reads nothing after it).
absl::Status CheckPngChunkLengths(const fs::path& path, const std::string& bytes) {
  const auto be32 = [&bytes](size_t i) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) v = (v << 8) | static_cast<unsigned char>(bytes[i + k]);
    return v;
  };
  for (size_t pos = 8; pos + 8 <= bytes.size();) {  // length and type
    const uint64_t length = be32(pos);
    const uint64_t left = bytes.size() - (pos + 8);
    if (length > left) {
      return absl::InvalidArgumentError(
          absl::StrCat(Show(path), ": corrupt or truncated PNG image: a chunk declares ", length,
                       " bytes of data, but only ", left, " are left in the file"));
    }
    if (bytes.compare(pos + 4, 4, "IEND") == 0) break;
    pos += 12 + length;  // length, type, data, CRC
  }
  return absl::OkStatus();
}

// `bytes` decoded, checked and resized to the task's height x width.
absl::StatusOr<Pixels> DecodeImage(const fs::path& path, const std::string& bytes,
                                   const ImageFolderOptions& options) {
  // stb also reads BMP, GIF, TGA, PSD, HDR, PIC and PNM, and its TGA test accepts much that is
  // not an image, so the format is pinned by signature before stb sees the bytes.
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static constexpr unsigned char kJpeg[] = {0xff, 0xd8, 0xff};
  const auto starts_with = [&bytes](const auto& magic) {
    return bytes.size() >= sizeof(magic) && std::memcmp(bytes.data(), magic, sizeof(magic)) == 0;
  };
  const bool png = starts_with(kPng);
  if (!png && !starts_with(kJpeg)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(path), ": not a PNG or JPEG image (",
                     bytes.empty() ? "the file is empty" : "no PNG or JPEG signature", ")"));
  }
  const absl::string_view format = png ? "PNG" : "JPEG";
  SHOAL_RETURN_IF_ERROR(png ? CheckPngChunkLengths(path, bytes)
                            : CheckJpegHuffmanTables(path, bytes));
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int size = static_cast<int>(bytes.size());  // <= max_image_bytes <= INT_MAX
  int width = 0, height = 0, channels = 0;
  if (stbi_info_from_memory(data, size, &width, &height, &channels) == 0) {
    // stbi_info tries every format in turn and leaves the last one's generic complaint
    // ("unknown image type"); a load stops at the decoder the signature picked, which says
    // what is wrong with the header.
    std::unique_ptr<unsigned char, StbiFree> probe(
        stbi_load_from_memory(data, size, &width, &height, &channels, 0));
    return absl::InvalidArgumentError(absl::StrCat(
        Show(path), ": corrupt or truncated ", format,
        " image: ", probe == nullptr ? FailureReason() : std::string("its header cannot be read")));
  }
  if (channels != options.channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(path), ": the image has ", DescribeChannels(channels),
                     "; the task expects ", DescribeChannels(options.channels),
                     channels == 2 || channels == 4 ? "; images with an alpha channel are refused"
                                                    : "; images are not converted"));
  }
  const uint64_t decoded = uint64_t(width) * uint64_t(height) * uint64_t(channels);
  if (decoded > kMaxDecodedBytes) {
    return absl::InvalidArgumentError(absl::StrCat(Show(path), ": the ", format, " image is ",
                                                   width, " x ", height, ", over the limit of ",
                                                   DescribeBytes(kMaxDecodedBytes), " decoded"));
  }
  int got_width = 0, got_height = 0, file_channels = 0;
  std::unique_ptr<unsigned char, StbiFree> source(
      stbi_load_from_memory(data, size, &got_width, &got_height, &file_channels, options.channels));
  if (source == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(path), ": corrupt or truncated ", format, " image: ", FailureReason()));
  }
  // The header said one thing and the decoder another: refuse rather than index out of bounds.
  if (got_width != width || got_height != height || file_channels != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(path), ": the ", format, " image's header disagrees with its data"));
  }
  Pixels out;
  const size_t target = size_t(options.height) * size_t(options.width) * size_t(channels);
  if (width == options.width && height == options.height) {
    out.interleaved.assign(source.get(), source.get() + target);
    return out;
  }
  out.interleaved.resize(target);
  out.resized = true;
  if (stbir_resize_uint8(source.get(), width, height, 0, out.interleaved.data(), options.width,
                         options.height, 0, channels) == 0) {
    return absl::InternalError(absl::StrCat(Show(path), ": cannot resize the image from ", width,
                                            " x ", height, " to ", options.width, " x ",
                                            options.height));
  }
  return out;
}

}  // namespace

absl::StatusOr<ImageFolderLoad> LoadImageFolderWithReport(const std::string& dir,
                                                          const ImageFolderOptions& options) {
  SHOAL_RETURN_IF_ERROR(ValidateOptions(dir, options));
  const fs::path root(dir);
  std::error_code ec;
  const fs::file_status status = fs::status(root, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(Show(root), ": no such directory"));
  }
  if (ec) return IoError(root, "read the directory", ec);
  if (status.type() != fs::file_type::directory) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(root), ": not a directory (expected one subdirectory per class)"));
  }

  ImageFolderLoad load;
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> classes,
                         FindClasses(root, options, load.skipped_files));

  // Every class is listed before anything is decoded: a bad layout fails in milliseconds, and
  // max_images holds before memory is spent.
  std::vector<std::vector<std::string>> files(classes.size());
  uint64_t total = 0;
  for (size_t label = 0; label < classes.size(); ++label) {
    const fs::path class_dir = root / classes[label];
    std::error_code ec;
    if (options.allow_missing_classes && !fs::exists(class_dir, ec)) continue;
    SHOAL_ASSIGN_OR_RETURN(
        Listing listing, ListDirectory(class_dir, [](const std::string& name, bool, bool is_file) {
          return is_file && !IsHidden(name) && HasImageExtension(name);
        }));
    load.skipped_files += listing.skipped;
    if (listing.names.empty() && !options.allow_missing_classes) {
      return absl::NotFoundError(absl::StrCat(Show(class_dir), ": class ",
                                              QuoteBytes(classes[label]),
                                              " has no images (.png, .jpg or .jpeg files)"));
    }
    total += listing.names.size();
    if (total > options.max_images) {
      return absl::InvalidArgumentError(absl::StrCat(Show(root),
                                                     ": more than ImageFolderOptions.max_images (",
                                                     options.max_images, ") images"));
    }
    files[label] = std::move(listing.names);
  }

  if (total == 0) {
    return absl::NotFoundError(
        absl::StrCat(Show(root), ": no images (.png, .jpg or .jpeg files) in any class directory"));
  }
  const int channels = options.channels;
  const size_t plane = size_t(options.height) * size_t(options.width);
  Dataset& data = load.dataset;
  data.sample_shape = {channels, options.height, options.width};
  data.class_names = std::move(classes);
  data.labels.reserve(total);
  for (size_t label = 0; label < files.size(); ++label) {
    const fs::path class_dir = root / data.class_names[label];
    for (const std::string& name : files[label]) {
      const fs::path path = class_dir / name;
      SHOAL_ASSIGN_OR_RETURN(std::string bytes, ReadImageFile(path, options.max_image_bytes));
      SHOAL_ASSIGN_OR_RETURN(Pixels pixels, DecodeImage(path, bytes, options));
      if (pixels.resized) ++load.resized_images;
      // Interleaved HWC in, planar CHW out.
      const size_t base = data.values.size();
      data.values.resize(base + plane * channels);
      for (int c = 0; c < channels; ++c) {
        const float mean = options.mean.empty() ? 0.0f : options.mean[c];
        const float sd = options.std.empty() ? 1.0f : options.std[c];
        float* out = data.values.data() + base + c * plane;
        for (size_t i = 0; i < plane; ++i) {
          out[i] = (static_cast<float>(pixels.interleaved[i * channels + c]) / 255.0f - mean) / sd;
        }
      }
      data.labels.push_back(static_cast<uint32_t>(label));
    }
  }
  data.count = data.labels.size();
  return load;
}

absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir, const ImageFolderOptions& options) {
  SHOAL_ASSIGN_OR_RETURN(ImageFolderLoad load, LoadImageFolderWithReport(dir, options));
  return std::move(load.dataset);
}

}  // namespace shoal::data
