#pragma once

// With shared tasks (--share-tasks), a coordinator answers a call about a task another one
// serves UNAVAILABLE naming that one; clients given every address move on, and the web console
// follows the name. The answer's form and its reading, in one place.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shoal::coordinator {

inline constexpr absl::string_view kServedBy = "\" is served by coordinator ";

inline absl::Status ServedByError(const std::string& task, const std::string& address) {
  return absl::UnavailableError(absl::StrCat("task \"", task, kServedBy, address));
}

// The address an answer of ServedByError names; nullopt for any other status.
inline std::optional<std::string> ServingCoordinator(const absl::Status& status) {
  if (!absl::IsUnavailable(status)) return std::nullopt;
  const absl::string_view message = status.message();
  const size_t at = message.rfind(kServedBy);
  if (at == absl::string_view::npos) return std::nullopt;
  const absl::string_view address = message.substr(at + kServedBy.size());
  if (address.empty() || address.find_first_of(" ;,") != absl::string_view::npos) {
    return std::nullopt;
  }
  return std::string(address);
}

}  // namespace shoal::coordinator
