#include "libs/privacy/rdp_accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace shoal::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Orders above this make the integer sum (one term per unit of order) needlessly long; no useful
// (ε, δ) comes from them.
constexpr double kMaxOrder = 65536;
// The fractional-order series stops once its terms fall this far (in log) below the running
// total and keep falling, as dp_accounting does: exp(-30) ≈ 1e-13 relative.
constexpr double kSeriesTolerance = 30;
constexpr int kMaxSeriesTerms = 10000;

double LogAdd(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

// log(sum(exp(terms))) without overflow.
double LogSumExp(const std::vector<double>& terms) {
  double hi = -kInf;
  for (double t : terms) hi = std::max(hi, t);
  if (hi == -kInf || hi == kInf) return hi;
  double sum = 0;
  for (double t : terms) sum += std::exp(t - hi);
  return hi + std::log(sum);
}

// A real number kept as a sign and log|x|, for series with terms of both signs.
struct SignedLog {
  bool negative = false;
  double log_abs = -kInf;

  void Add(bool term_negative, double log_term) {
    if (log_term == -kInf) return;
    if (log_abs == -kInf) {
      negative = term_negative;
      log_abs = log_term;
    } else if (term_negative == negative) {
      log_abs = LogAdd(log_abs, log_term);
    } else if (log_term > log_abs) {
      log_abs = log_term + std::log1p(-std::exp(log_abs - log_term));
      negative = term_negative;
    } else if (log_term < log_abs) {
      log_abs = log_abs + std::log1p(-std::exp(log_term - log_abs));
    } else {
      log_abs = -kInf;
      negative = false;
    }
  }
};

// log(erfc(x)), accurate where erfc(x) underflows: past x = 20 the asymptotic expansion
// erfc(x) = exp(-x²) / (x√π) (1 - 1/(2x²) + 3/(4x⁴) - 15/(8x⁶) + 105/(16x⁸) - ...), whose next
// term is below 1e-13 there.
double LogErfc(double x) {
  if (x < 20) return std::log(std::erfc(x));
  const double inv2 = 1 / (x * x);
  const double series = inv2 * (-0.5 + inv2 * (0.75 + inv2 * (-15.0 / 8 + inv2 * (105.0 / 16))));
  return -0.5 * std::log(std::numbers::pi) - std::log(x) - x * x + std::log1p(series);
}

// log(A_α) for integer α ≥ 2 (Mironov et al. 2019, Sec. 3.2):
// A_α = sum_{i=0..α} C(α, i) q^i (1-q)^(α-i) exp((i² - i) / (2σ²)).
double LogAInteger(double q, double sigma, int64_t alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_2s2 = 1 / (2 * sigma * sigma);
  std::vector<double> terms;
  terms.reserve(static_cast<size_t>(alpha) + 1);
  double log_binom = 0;  // log C(α, i), by C(α, i+1) = C(α, i) (α - i) / (i + 1)
  for (int64_t i = 0; i <= alpha; ++i) {
    const double di = static_cast<double>(i);
    terms.push_back(log_binom + di * log_q + static_cast<double>(alpha - i) * log_1mq +
                    (di * di - di) * inv_2s2);
    if (i < alpha) log_binom += std::log(static_cast<double>(alpha - i)) - std::log(di + 1);
  }
  return LogSumExp(terms);
}

// log(A_α) for fractional α > 1 (Mironov et al. 2019, Sec. 3.3): the integral split at
// z0 = σ² log(1/q - 1) + 1/2, each side a binomial series (generalised binomial coefficients,
// whose sign alternates once i > α + 1) with Gaussian-tail factors. +infinity, which drops the
// order, when the series does not settle.
double LogAFractional(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double inv_2s2 = 1 / (2 * sigma * sigma);
  const double z0 = sigma * sigma * (log_1mq - log_q) + 0.5;
  const double erfc_scale = 1 / (std::numbers::sqrt2 * sigma);
  const double log_half = -std::numbers::ln2;
  const double floor_alpha = std::floor(alpha);
  SignedLog a0, a1;
  double log_binom = 0;  // log |C(α, i)|
  double last_s0 = kInf, last_s1 = kInf;
  for (int i = 0; i < kMaxSeriesTerms; ++i) {
    const double di = i;
    const double j = alpha - di;
    // C(α, i) = α (α-1) ... (α-i+1) / i!: one negative factor for each m ≤ i-1 above α.
    const bool negative = static_cast<int64_t>(std::max(0.0, di - 1 - floor_alpha)) % 2 == 1;
    const double log_t0 = log_binom + di * log_q + j * log_1mq;
    const double log_t1 = log_binom + j * log_q + di * log_1mq;
    const double log_e0 = log_half + LogErfc((di - z0) * erfc_scale);
    const double log_e1 = log_half + LogErfc((z0 - j) * erfc_scale);
    const double log_s0 = log_t0 + (di * di - di) * inv_2s2 + log_e0;
    const double log_s1 = log_t1 + (j * j - j) * inv_2s2 + log_e1;
    a0.Add(negative, log_s0);
    a1.Add(negative, log_s1);
    if (a0.negative || a1.negative) return kInf;  // each half is a positive integral
    const double total = LogAdd(a0.log_abs, a1.log_abs);
    if (log_s0 < last_s0 && log_s1 < last_s1 &&
        std::max(log_s0, log_s1) < total - kSeriesTolerance) {
      return total;
    }
    last_s0 = log_s0;
    last_s1 = log_s1;
    log_binom += std::log(std::abs(alpha - di)) - std::log(di + 1);
  }
  return kInf;
}

absl::Status CheckRateAndNoise(double sampling_rate, double noise_multiplier) {
  if (!(sampling_rate >= 0 && sampling_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling rate must be in [0, 1], got ", sampling_rate));
  }
  if (!(noise_multiplier >= 0) || !std::isfinite(noise_multiplier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("noise multiplier must be finite and >= 0, got ", noise_multiplier));
  }
  return absl::OkStatus();
}

absl::Status CheckOrders(absl::Span<const double> orders) {
  if (orders.empty()) return absl::InvalidArgumentError("RDP orders: none given");
  absl::flat_hash_set<double> seen;
  for (double order : orders) {
    if (!(order > 1) || order > kMaxOrder) {
      return absl::InvalidArgumentError(
          absl::StrCat("RDP order must be in (1, ", kMaxOrder, "], got ", order));
    }
    if (!seen.insert(order).second) {
      return absl::InvalidArgumentError(absl::StrCat("RDP order ", order, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDelta(double delta) {
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", delta));
  }
  return absl::OkStatus();
}

double OneStepRdp(double q, double sigma, double alpha) {
  if (q == 0) return 0;
  if (sigma == 0) return kInf;
  if (q == 1) return alpha / (2 * sigma * sigma);
  const double log_a = alpha == std::floor(alpha)
                           ? LogAInteger(q, sigma, static_cast<int64_t>(alpha))
                           : LogAFractional(q, sigma, alpha);
  // A_α ≥ 1 (a Rényi divergence is never negative); rounding may dip just below.
  return std::max(0.0, log_a / (alpha - 1));
}

double EpsilonAtOrder(double alpha, double rdp, double delta, RdpConversion conversion) {
  if (std::isinf(rdp)) return kInf;
  switch (conversion) {
    case RdpConversion::kBalle2020:
      // The KL bound: δ ≤ sqrt(1 - exp(-rdp)) already holds with ε = 0.
      if (delta * delta + std::expm1(-rdp) > 0) return 0;
      if (alpha <= 1.01) return kInf;
      return rdp + std::log1p(-1 / alpha) - std::log(delta * alpha) / (alpha - 1);
    case RdpConversion::kMironov2017:
      return rdp - std::log(delta) / (alpha - 1);
  }
  return kInf;
}

}  // namespace

std::vector<double> DefaultRdpOrders() {
  std::vector<double> orders = {1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5};
  for (int order = 5; order < 64; ++order) orders.push_back(order);
  for (double order : {128, 256, 512}) orders.push_back(order);
  return orders;
}

absl::StatusOr<std::vector<double>> SampledGaussianRdp(double sampling_rate,
                                                       double noise_multiplier,
                                                       absl::Span<const double> orders) {
  if (absl::Status s = CheckRateAndNoise(sampling_rate, noise_multiplier); !s.ok()) return s;
  if (absl::Status s = CheckOrders(orders); !s.ok()) return s;
  std::vector<double> rdp;
  rdp.reserve(orders.size());
  for (double alpha : orders) rdp.push_back(OneStepRdp(sampling_rate, noise_multiplier, alpha));
  return rdp;
}

absl::StatusOr<PrivacySpent> EpsilonFromRdp(absl::Span<const double> orders,
                                            absl::Span<const double> rdp, double delta,
                                            RdpConversion conversion) {
  if (orders.size() != rdp.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RDP: ", orders.size(), " orders but ", rdp.size(), " values"));
  }
  if (absl::Status s = CheckOrders(orders); !s.ok()) return s;
  if (absl::Status s = CheckDelta(delta); !s.ok()) return s;
  bool all_zero = true;
  for (size_t i = 0; i < rdp.size(); ++i) {
    if (!(rdp[i] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("RDP at order ", orders[i], " must be >= 0, got ", rdp[i]));
    }
    all_zero = all_zero && rdp[i] == 0;
  }
  // Divergence 0 at every order: the outputs' distributions do not depend on any one record.
  if (all_zero) return PrivacySpent{0, 0};
  PrivacySpent best{kInf, 0};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double epsilon = EpsilonAtOrder(orders[i], rdp[i], delta, conversion);
    if (epsilon < best.epsilon) best = {epsilon, orders[i]};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

absl::StatusOr<RdpAccountant> RdpAccountant::Create(RdpAccountantOptions options) {
  std::vector<double> rdp(options.orders.size(), 0.0);
  return Restore(std::move(options), std::move(rdp), 0);
}

absl::StatusOr<RdpAccountant> RdpAccountant::Restore(RdpAccountantOptions options,
                                                     std::vector<double> rdp, int64_t steps) {
  if (absl::Status s = CheckOrders(options.orders); !s.ok()) return s;
  if (rdp.size() != options.orders.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RDP accountant: ", options.orders.size(),
                                                   " orders but ", rdp.size(), " values"));
  }
  for (size_t i = 0; i < rdp.size(); ++i) {
    if (!(rdp[i] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("RDP accountant: value at order ", options.orders[i], " is ", rdp[i]));
    }
  }
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RDP accountant: step count ", steps));
  }
  return RdpAccountant(std::move(options), std::move(rdp), steps);
}

absl::Status RdpAccountant::AddSteps(double sampling_rate, double noise_multiplier, int64_t steps) {
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step count must be >= 0, got ", steps));
  }
  absl::StatusOr<std::vector<double>> step =
      SampledGaussianRdp(sampling_rate, noise_multiplier, options_.orders);
  if (!step.ok()) return step.status();
  if (steps == 0) return absl::OkStatus();
  for (size_t i = 0; i < rdp_.size(); ++i) {
    // 0 × ∞ (no step of a non-private mechanism) is excluded above.
    rdp_[i] += (*step)[i] * static_cast<double>(steps);
  }
  steps_ = steps > std::numeric_limits<int64_t>::max() - steps_
               ? std::numeric_limits<int64_t>::max()
               : steps_ + steps;
  return absl::OkStatus();
}

absl::StatusOr<PrivacySpent> RdpAccountant::Spent(double delta) const {
  return EpsilonFromRdp(options_.orders, rdp_, delta, options_.conversion);
}

absl::StatusOr<int64_t> RdpAccountant::StepsLeft(double sampling_rate, double noise_multiplier,
                                                 double target_epsilon, double delta) const {
  if (!(target_epsilon > 0) || !std::isfinite(target_epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target epsilon must be finite and > 0, got ", target_epsilon));
  }
  if (absl::Status s = CheckDelta(delta); !s.ok()) return s;
  absl::StatusOr<std::vector<double>> step =
      SampledGaussianRdp(sampling_rate, noise_multiplier, options_.orders);
  if (!step.ok()) return step.status();
  // ε after s more steps; nondecreasing in s, so the answer is found by doubling then bisecting.
  std::vector<double> after(rdp_.size());
  auto fits = [&](int64_t s) {
    for (size_t i = 0; i < rdp_.size(); ++i) {
      after[i] = s == 0 ? rdp_[i] : rdp_[i] + (*step)[i] * static_cast<double>(s);
    }
    absl::StatusOr<PrivacySpent> spent =
        EpsilonFromRdp(options_.orders, after, delta, options_.conversion);
    return spent.ok() && spent->epsilon <= target_epsilon;
  };
  if (!fits(0)) return 0;
  if (std::all_of(step->begin(), step->end(), [](double r) { return r == 0; })) {
    return std::numeric_limits<int64_t>::max();
  }
  int64_t lo = 0;  // fits
  int64_t hi = 1;  // to be tested, then does not fit
  while (fits(hi)) {
    lo = hi;
    if (hi > (std::numeric_limits<int64_t>::max() >> 2)) return std::numeric_limits<int64_t>::max();
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace shoal::privacy
