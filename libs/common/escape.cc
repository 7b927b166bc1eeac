#include "libs/common/escape.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace shoal {
namespace {

// Length of the well-formed UTF-8 sequence of a printable non-ASCII code point starting at
// `s[0]`, or 0 when there is none (malformed, overlong, surrogate, C1 control, > U+10FFFF).
size_t Utf8Length(absl::string_view s);

// Length of the UTF-8 sequence of a printable non-ASCII code point (U+00A0 and up) starting at
// `s[0]`, or 0 when there is none (malformed, or a C1 control).
size_t PrintableUtf8Length(absl::string_view s) {
  const size_t len = Utf8Length(s);
  if (len < 2) return 0;
  // Two-byte sequences from U+0080 to U+009F are the C1 controls.
  if (len == 2 && static_cast<uint8_t>(s[0]) == 0xC2 && static_cast<uint8_t>(s[1]) < 0xA0) return 0;
  return len;
}

void AppendEscaped(absl::string_view bytes, size_t max_bytes, bool quote, std::string& out) {
  const bool truncated = bytes.size() > max_bytes;
  if (truncated) bytes = bytes.substr(0, max_bytes);
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t c = static_cast<uint8_t>(bytes[i]);
    if (c >= 0x80) {
      const size_t len = PrintableUtf8Length(bytes.substr(i));
      if (len > 0) {
        out.append(bytes.data() + i, len);
        i += len;
        continue;
      }
    }
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += quote ? "\\\"" : "\"";
        break;
      default:
        if (c < 0x20 || c >= 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  if (truncated) out += "...";
}

// Length of the well-formed UTF-8 sequence starting at `s[0]` (any code point), 0 if none.
size_t Utf8Length(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    cp = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    cp = lead & 0x07;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  const uint32_t min_for_length[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_length[len] || cp > 0x10FFFF) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return len;
}

}  // namespace

bool IsValidUtf8(absl::string_view bytes) {
  while (!bytes.empty()) {
    const size_t len = Utf8Length(bytes);
    if (len == 0) return false;
    bytes.remove_prefix(len);
  }
  return true;
}

std::string EscapeBytes(absl::string_view bytes, size_t max_bytes) {
  std::string out;
  AppendEscaped(bytes, max_bytes, /*quote=*/false, out);
  return out;
}

std::string QuoteBytes(absl::string_view bytes, size_t max_bytes) {
  std::string out = "\"";
  AppendEscaped(bytes, max_bytes, /*quote=*/true, out);
  out += "\"";
  return out;
}

}  // namespace shoal
