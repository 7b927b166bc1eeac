#pragma once

// PNG and JPEG decoding for image folders: libpng for PNG, libjpeg-turbo (its TurboJPEG API) for
// JPEG, both from Debian and both fuzzed upstream. An earlier loader used stb_image 2.27
// (Debian bookworm's libstb), whose decoders kept yielding memory errors to this project's
// fuzz target (docs/performance-history.md, "Fuzzing record").

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal::data {

struct DecodedImage {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<unsigned char> pixels;  // height x width x channels, 8 bits each, interleaved
};

// Decodes the PNG or JPEG file held in `bytes` (the format is told by its signature) into
// `channels` (1: grayscale, 3: RGB) 8-bit channels. Images are not converted between channel
// counts: an image with another count, or with an alpha channel, is refused. 16-bit PNG samples
// are scaled to 8 bits and palettes and 1/2/4-bit grays expanded; a PNG's tRNS colour key is
// ignored, except in a palette image (whose transparency is an alpha channel). A JPEG that the
// decoder would only warn about (a truncated file, corrupt data) is refused too.
// Refused before any pixel memory is spent: a decoded size over `max_decoded_bytes`.
// Errors are InvalidArgument (InternalError only when a decoder cannot start), with messages
// that do not name the file (the caller prefixes it) and that hold no raw bytes from it.
// Thread-safe.
absl::StatusOr<DecodedImage> DecodeImage(absl::string_view bytes, int channels,
                                         uint64_t max_decoded_bytes);

// "1 channel (grayscale)", "3 channels (RGB)", ...
std::string DescribeChannels(int channels);

}  // namespace shoal::data
