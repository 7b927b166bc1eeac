#include "services/aggregator/memory_budget.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::aggregator {
namespace {

// a x b, saturating (a model that big is refused either way).
uint64_t Times(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    return std::numeric_limits<uint64_t>::max();
  }
  return a * b;
}

std::string OverTheLimit(uint64_t max_bytes) {
  return absl::StrCat(", over this aggregator's --max-buffer-bytes ", HumanBytes(max_bytes));
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  // Switch units before rounding would print "1024.0".
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

absl::Status CheckRoundMemory(const aggregation::Strategy& strategy, size_t updates,
                              uint64_t model_bytes, uint64_t max_bytes, absl::string_view what) {
  const uint64_t held = strategy.RoundMemoryBytes(updates, model_bytes);
  if (held <= max_bytes) return absl::OkStatus();
  if (strategy.streaming()) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", strategy.name(),
                                                     " holds a running sum of ", HumanBytes(held),
                                                     OverTheLimit(max_bytes)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": ", strategy.name(), " holds up to ", updates, " updates × ",
                   HumanBytes(model_bytes), " = ", HumanBytes(held), OverTheLimit(max_bytes)));
}

absl::Status CheckBufferMemory(const aggregation::Strategy& strategy, size_t buffer_size,
                               uint64_t model_bytes, uint64_t max_bytes, absl::string_view what) {
  const uint64_t held = Times(buffer_size, model_bytes);
  if (held <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " (", strategy.name(), ") holds up to ", buffer_size, " updates × ",
                   HumanBytes(model_bytes), " = ", HumanBytes(held), OverTheLimit(max_bytes)));
}

}  // namespace shoal::aggregator
