// stb_image and stb_image_resize compiled into fuzz_image_folder with coverage and sanitizers
// (see fuzz_image_folder.cc). Built with -fno-sanitize=nonnull-attribute (tests/fuzz/
// CMakeLists.txt): stb 2.27 calls memcpy(dst, NULL, 0) for an empty PNG IDAT chunk
// (stbi__getn), undefined in the letter of C but a no-op in glibc, and that report would stop
// every run at the first empty chunk. ASan and every other UBSan check still watch this code.

#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Weverything"
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#pragma clang diagnostic pop
