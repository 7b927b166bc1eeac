#include "libs/gossip/interpolation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::gossip {
namespace {

absl::Status CheckState(const PeerState& s, const char* who) {
  if (!std::isfinite(s.clock) || s.clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " clock must be finite and >= 0, got ", s.clock));
  }
  if (!std::isfinite(s.loss) || s.loss < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " loss must be finite and >= 0, got ", s.loss));
  }
  return absl::OkStatus();
}

// a / (a + b), with the 0/0 case (both models equally new or equally perfect) at 1/2.
double Ratio(double a, double b) {
  const double sum = a + b;
  if (sum <= 0) return 0.5;
  return a / sum;
}

absl::Status CheckMix(double f, size_t a, size_t b) {
  if (!(f >= 0 && f <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("interpolation factor must be in [0, 1], got ", f));
  }
  if (a != b) {
    return absl::InvalidArgumentError(absl::StrCat("models differ in size: ", a, " values vs ", b));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> InterpolationFactor(const GossipConfig& config, const PeerState& local,
                                           const PeerState& peer) {
  if (absl::Status s = CheckState(local, "local"); !s.ok()) return s;
  if (absl::Status s = CheckState(peer, "peer"); !s.ok()) return s;
  double f = 0;
  switch (config.interpolation) {
    case common::v1::INTERPOLATION_CLOCK:
      f = Ratio(peer.clock, local.clock);
      break;
    case common::v1::INTERPOLATION_LOSS:
      f = Ratio(local.loss, peer.loss);
      break;
    case common::v1::INTERPOLATION_CONSTANT:
    case common::v1::INTERPOLATION_UNSPECIFIED:
    default:
      f = config.constant_factor;
      break;
  }
  if (config.divergence_threshold > 0 && local.loss < config.divergence_threshold) {
    f *= local.loss / config.divergence_threshold;
  }
  if (f < 0) f = 0;
  if (f > 1) f = 1;
  return f;
}

double InterpolateClock(double f, double clock, double peer_clock) {
  return f * peer_clock + (1 - f) * clock;
}

absl::Status Interpolate(double f, absl::Span<const float> peer, absl::Span<float> local) {
  if (absl::Status s = CheckMix(f, peer.size(), local.size()); !s.ok()) return s;
  const float ff = static_cast<float>(f);
  const float keep = static_cast<float>(1 - f);
  const float* q = peer.data();
  float* p = local.data();
  const size_t n = local.size();
  for (size_t i = 0; i < n; ++i) p[i] = ff * q[i] + keep * p[i];
  return absl::OkStatus();
}

absl::Status InterpolateKeepingStep(double f, absl::Span<const float> peer,
                                    absl::Span<const float> before, absl::Span<float> local) {
  if (absl::Status s = CheckMix(f, peer.size(), local.size()); !s.ok()) return s;
  if (absl::Status s = CheckMix(f, before.size(), local.size()); !s.ok()) return s;
  const float ff = static_cast<float>(f);
  const float* q = peer.data();
  const float* b = before.data();
  float* p = local.data();
  const size_t n = local.size();
  for (size_t i = 0; i < n; ++i) p[i] += ff * (q[i] - b[i]);
  return absl::OkStatus();
}

bool AllFinite(absl::Span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<float>> MeanModel(const std::vector<absl::Span<const float>>& models) {
  if (models.empty()) return absl::InvalidArgumentError("no models to average");
  const size_t n = models[0].size();
  std::vector<double> acc(n, 0.0);
  for (const auto& m : models) {
    if (m.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("models differ in size: ", n, " values vs ", m.size()));
    }
    for (size_t i = 0; i < n; ++i) acc[i] += m[i];
  }
  std::vector<float> out(n);
  const double k = static_cast<double>(models.size());
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(acc[i] / k);
  return out;
}

absl::StatusOr<double> ConsensusDistance(const std::vector<absl::Span<const float>>& models) {
  if (models.size() < 2) return 0.0;
  absl::StatusOr<std::vector<float>> mean = MeanModel(models);
  if (!mean.ok()) return mean.status();
  double total = 0;
  for (const auto& m : models) {
    for (size_t i = 0; i < m.size(); ++i) {
      const double d = static_cast<double>(m[i]) - (*mean)[i];
      total += d * d;
    }
  }
  return std::sqrt(total / static_cast<double>(models.size()));
}

}  // namespace shoal::gossip
