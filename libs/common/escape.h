#pragma once

// Printable forms of untrusted bytes for error messages, so that a binary or hostile input
// quoted in an error cannot write control sequences to the operator's terminal or logs.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace shoal {

// Longest input EscapeBytes copies by default; longer input ends in "...".
inline constexpr size_t kMaxEscapedInputBytes = 200;

// `bytes` with every byte that is not printable escaped: \n \r \t \\ and \xNN for the rest.
// Printable ASCII and well-formed UTF-8 of printable code points (U+00A0 and up) are kept;
// C0/C1 controls, DEL and malformed UTF-8 are escaped. At most `max_bytes` input bytes are
// shown; longer input gets a "..." suffix.
std::string EscapeBytes(absl::string_view bytes, size_t max_bytes = kMaxEscapedInputBytes);

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF): what proto3 `string` fields must hold.
bool IsValidUtf8(absl::string_view bytes);

// EscapeBytes in double quotes, `"` escaped as \": for quoting a value read from input.
std::string QuoteBytes(absl::string_view bytes, size_t max_bytes = kMaxEscapedInputBytes);

}  // namespace shoal
