#include "libs/data/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"

namespace shoal::data {
namespace {

// Ancillary chunks (text, ICC profiles) are not used; one larger than this is refused rather
// than buffered.
constexpr size_t kMaxPngChunkBytes = size_t{8} << 20;

absl::Status Corrupt(absl::string_view format, absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("corrupt or truncated ", format, " image: ", EscapeBytes(reason)));
}

absl::Status CheckShape(absl::string_view format, uint64_t width, uint64_t height, int channels,
                        int want, uint64_t max_decoded_bytes) {
  if (channels != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the image has ", DescribeChannels(channels), "; the task expects ", DescribeChannels(want),
        channels == 2 || channels == 4 ? "; images with an alpha channel are refused"
                                       : "; images are not converted"));
  }
  if (width * height * uint64_t(channels) > max_decoded_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the ", format, " image is ", width, " x ",
                                                   height, ", over the limit of ",
                                                   DescribeBytes(max_decoded_bytes), " decoded"));
  }
  return absl::OkStatus();
}

// libpng reports errors by longjmp to the frame that set png_jmpbuf. Only the two small
// functions below set it, and their frames hold nothing with a destructor, so a longjmp skips
// no C++ cleanup; the read state and the pixels live in the caller's frame.
struct PngRead {
  PngRead(absl::string_view bytes)
      : data(reinterpret_cast<const unsigned char*>(bytes.data())), size(bytes.size()) {}
  ~PngRead() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
  PngRead(const PngRead&) = delete;
  PngRead& operator=(const PngRead&) = delete;

  png_structp png = nullptr;
  png_infop info = nullptr;
  const unsigned char* data;
  size_t size;
  size_t pos = 0;
  char error[256] = "unknown error";
};

void PngError(png_structp png, png_const_charp message) {
  auto* read = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(read->error, sizeof(read->error), "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // benign: an ancillary chunk is skipped

void PngReadBytes(png_structp png, png_bytep out, size_t count) {
  auto* read = static_cast<PngRead*>(png_get_io_ptr(png));
  if (count > read->size - read->pos) png_error(png, "the file ends before the image does");
  std::memcpy(out, read->data + read->pos, count);
  read->pos += count;
}

// Reads the signature and every chunk before the image data. False: read.error says why.
bool PngReadHeader(PngRead& read) {
  if (setjmp(png_jmpbuf(read.png))) return false;
  png_read_info(read.png, read.info);
  return true;
}

// Decodes the image into `rows` as 8-bit samples, and the chunks after it up to IEND.
// Each expansion only for its own colour type: png_set_palette_to_rgb would also turn a gray or
// RGB image's tRNS colour key into an alpha channel.
bool PngReadPixels(PngRead& read, int color_type, png_bytepp rows, size_t row_bytes) {
  if (setjmp(png_jmpbuf(read.png))) return false;
  png_set_scale_16(read.png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(read.png);
  if (color_type == PNG_COLOR_TYPE_GRAY) png_set_expand_gray_1_2_4_to_8(read.png);
  png_set_interlace_handling(read.png);
  png_read_update_info(read.png, read.info);
  if (png_get_rowbytes(read.png, read.info) != row_bytes) {
    png_error(read.png, "unexpected row size after conversion to 8 bits");
  }
  png_read_image(read.png, rows);
  png_read_end(read.png, nullptr);
  return true;
}

absl::StatusOr<DecodedImage> DecodePng(absl::string_view bytes, int want,
                                       uint64_t max_decoded_bytes) {
  PngRead read(bytes);
  read.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &read, PngError, PngWarning);
  if (read.png != nullptr) read.info = png_create_info_struct(read.png);
  if (read.info == nullptr) return absl::InternalError("cannot start the PNG decoder");
  png_set_read_fn(read.png, &read, PngReadBytes);
  png_set_chunk_malloc_max(read.png, kMaxPngChunkBytes);
  if (!PngReadHeader(read)) return Corrupt("PNG", read.error);

  const uint32_t width = png_get_image_width(read.png, read.info);
  const uint32_t height = png_get_image_height(read.png, read.info);
  const int color_type = png_get_color_type(read.png, read.info);
  int channels = 0;
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      channels = 1;
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      channels = 2;
      break;
    case PNG_COLOR_TYPE_RGB:
      channels = 3;
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      channels = 4;
      break;
    case PNG_COLOR_TYPE_PALETTE:
      channels = png_get_valid(read.png, read.info, PNG_INFO_tRNS) != 0 ? 4 : 3;
      break;
    default:
      return Corrupt("PNG", "unknown colour type");  // libpng refuses these already
  }
  if (absl::Status shape = CheckShape("PNG", width, height, channels, want, max_decoded_bytes);
      !shape.ok()) {
    return shape;
  }
  DecodedImage image;
  image.width = static_cast<int>(width);
  image.height = static_cast<int>(height);
  image.channels = channels;
  const size_t row_bytes = size_t{width} * size_t(channels);
  image.pixels.resize(row_bytes * height);
  std::vector<png_bytep> rows(height);
  for (size_t y = 0; y < height; ++y) rows[y] = image.pixels.data() + y * row_bytes;
  if (!PngReadPixels(read, color_type, rows.data(), row_bytes)) return Corrupt("PNG", read.error);
  return image;
}

struct TjDestroy {
  void operator()(void* handle) const { tjDestroy(handle); }
};

absl::StatusOr<DecodedImage> DecodeJpeg(absl::string_view bytes, int want,
                                        uint64_t max_decoded_bytes) {
  std::unique_ptr<void, TjDestroy> tj(tjInitDecompress());
  if (tj == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot start the JPEG decoder: ", tjGetErrorStr2(nullptr)));
  }
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), data, bytes.size(), &width, &height, &subsampling,
                          &colorspace) != 0) {
    return Corrupt("JPEG", tjGetErrorStr2(tj.get()));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return absl::InvalidArgumentError(
        absl::StrCat("the image has 4 channels (CMYK); the task "
                     "expects ",
                     DescribeChannels(want), "; CMYK images are not converted"));
  }
  const int channels = colorspace == TJCS_GRAY ? 1 : 3;
  if (width < 1 || height < 1) return Corrupt("JPEG", "the image has no pixels");
  if (absl::Status shape =
          CheckShape("JPEG", uint64_t(width), uint64_t(height), channels, want, max_decoded_bytes);
      !shape.ok()) {
    return shape;
  }
  DecodedImage image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.resize(size_t(width) * size_t(height) * size_t(channels));
  // STOPONWARNING: a truncated or corrupt file is refused, not filled in with grey.
  // LIMITSCANS: a progressive file of thousands of scans (seconds of CPU each) is refused.
  if (tjDecompress2(tj.get(), data, bytes.size(), image.pixels.data(), width, 0, height,
                    channels == 1 ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0) {
    return Corrupt("JPEG", tjGetErrorStr2(tj.get()));
  }
  return image;
}

}  // namespace

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

absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, int channels,
                                         uint64_t max_decoded_bytes) {
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static constexpr unsigned char kJpeg[] = {0xff, 0xd8, 0xff};
  const auto starts_with = [bytes](const auto& magic) {
    return bytes.size() >= sizeof(magic) && std::memcmp(bytes.data(), magic, sizeof(magic)) == 0;
  };
  if (starts_with(kPng)) return DecodePng(bytes, channels, max_decoded_bytes);
  if (starts_with(kJpeg)) return DecodeJpeg(bytes, channels, max_decoded_bytes);
  return absl::InvalidArgumentError(
      absl::StrCat("not a PNG or JPEG image (",
                   bytes.empty() ? "the file is empty" : "no PNG or JPEG signature", ")"));
}

}  // namespace shoal::data
