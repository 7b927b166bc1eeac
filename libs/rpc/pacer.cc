#include "libs/rpc/pacer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shoal::rpc {

absl::StatusOr<PacingSetting> PacingSetting::Parse(absl::string_view value) {
  PacingSetting s;
  if (value == "auto") return s;
  s.automatic = false;
  if (value == "off") return s;
  double mbit = 0;
  if (!absl::SimpleAtod(value, &mbit) || !(mbit > 0) || mbit > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--serve-pacing: want auto, off, or a rate in Mbit/s in (0, 1000000], got '", value, "'"));
  }
  s.bytes_per_second = mbit * 1e6 / 8;
  return s;
}

double PacingSetting::RateFor(double measured_upload) const {
  if (!automatic) return bytes_per_second;
  return measured_upload > 0 && measured_upload < kSlowUplinkBelow ? measured_upload : 0;
}

Pacer::Pacer(std::function<double()> rate, Clock& clock) : rate_(std::move(rate)), clock_(clock) {}

double Pacer::rate() const {
  const double r = rate_ ? rate_() : 0;
  return r > 0 ? r : 0;
}

absl::Duration Pacer::Reserve(size_t bytes) {
  const double r = rate();
  if (r <= 0) return absl::ZeroDuration();
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  const absl::Time start = std::max(now, free_at_);
  free_at_ = start + absl::Seconds(static_cast<double>(bytes) / r);
  return start - now;
}

size_t Pacer::MessageBytes(size_t unpaced) const {
  const double r = rate();
  if (r <= 0) return unpaced;
  constexpr size_t kMin = size_t{16} << 10;
  constexpr size_t kMax = size_t{256} << 10;
  return std::clamp(static_cast<size_t>(r * 0.005), kMin, kMax);
}

}  // namespace shoal::rpc
