#include "libs/common/address.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shoal {

std::string HostPort::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected HOST:PORT, got \"", text, "\""));
  }
  HostPort hp;
  hp.host = std::string(text.substr(0, colon));
  int port = -1;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": port must be 0..65535, got \"", text.substr(colon + 1), "\""));
  }
  hp.port = port;
  return hp;
}

}  // namespace shoal
