#pragma once

// Checks shared by the fuzz targets: a failed check aborts, which libFuzzer reports as a crash
// and saves the input.

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shoal::fuzz {

#define SHOAL_FUZZ_CHECK(cond)                                                           \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// Errors that quote input must not carry raw control bytes to a terminal.
inline bool IsPrintableMessage(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) return false;
    // C1 controls (U+0080..U+009F) in UTF-8.
    if (c == 0xC2 && i + 1 < text.size() &&
        (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0x80) {
      return false;
    }
  }
  return true;
}

inline void CheckErrorIsClean(const absl::Status& status) {
  if (status.ok()) return;
  if (!IsPrintableMessage(status.message())) {
    std::fprintf(stderr, "error message with raw control bytes: %.*s\n",
                 static_cast<int>(status.message().size()), status.message().data());
    std::abort();
  }
  SHOAL_FUZZ_CHECK(!status.message().empty());
}

}  // namespace shoal::fuzz
