// stb_image_resize compiled into fuzz_image_folder with coverage and sanitizers (see
// fuzz_image_folder.cc): the executable's definitions take the place of Debian's uninstrumented
// libstb.so, so ASan and UBSan watch the resize of every decoded image.

#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Weverything"
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
#pragma clang diagnostic pop
