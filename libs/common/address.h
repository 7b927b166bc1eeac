#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

struct HostPort {
  std::string host;
  int port = 0;  // 0 = pick a free port
  std::string ToString() const;
};

// Parses "HOST:PORT" (HOST may be a name, IPv4, or [IPv6]). `what` names the flag or field in
// the error, e.g. "--listen".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what);

}  // namespace shoal
