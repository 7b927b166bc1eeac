#include "libs/data/image_folder.h"

// Debian's libstb.so already holds stb_image_resize's implementation (built with no optional
// macros), so STB_IMAGE_RESIZE_IMPLEMENTATION must not be defined here.
#include <stb/stb_image_resize.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
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
#include "libs/data/image_decode.h"

namespace shoal::data {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxSide = 4096;
// A small compressed file can declare a huge canvas (a PNG of zeros compresses about 1000:1), so
// the decoded size is capped from the header before any pixel memory is allocated: 256 MiB is a
// 9000 x 9000 RGB photo, far past what a resize to at most 4096 x 4096 needs.
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

struct Pixels {
  std::vector<unsigned char> interleaved;  // height x width x channels
  bool resized = false;
};

// `bytes` decoded, checked and resized to the task's height x width.
absl::StatusOr<Pixels> DecodeAndResize(const fs::path& path, const std::string& bytes,
                                       const ImageFolderOptions& options) {
  absl::StatusOr<DecodedImage> decoded = DecodeImage(bytes, options.channels, kMaxDecodedBytes);
  if (!decoded.ok()) {
    return absl::Status(decoded.status().code(),
                        absl::StrCat(Show(path), ": ", decoded.status().message()));
  }
  const DecodedImage& image = *decoded;
  Pixels out;
  if (image.width == options.width && image.height == options.height) {
    out.interleaved = std::move(decoded->pixels);
    return out;
  }
  out.interleaved.resize(size_t(options.height) * size_t(options.width) * size_t(image.channels));
  out.resized = true;
  if (stbir_resize_uint8(image.pixels.data(), image.width, image.height, 0, out.interleaved.data(),
                         options.width, options.height, 0, image.channels) == 0) {
    return absl::InternalError(absl::StrCat(Show(path), ": cannot resize the image from ",
                                            image.width, " x ", image.height, " to ", options.width,
                                            " x ", options.height));
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
      SHOAL_ASSIGN_OR_RETURN(Pixels pixels, DecodeAndResize(path, bytes, options));
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
