#pragma once

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shoal::peer {

// `s` with its message prefixed by the flag it is about ("--data-dir: ..."), unless it already
// starts with it; OK stays OK.
inline absl::Status FlagError(absl::string_view flag, const absl::Status& s) {
  if (s.ok() || absl::StartsWith(s.message(), flag)) return s;
  return absl::Status(s.code(), absl::StrCat(flag, ": ", s.message()));
}

}  // namespace shoal::peer
