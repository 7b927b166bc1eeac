#pragma once

// Rényi differential privacy (RDP) accounting for the sampled Gaussian mechanism: each step
// samples every record (or peer) independently with probability q (Poisson sampling), sums the
// sampled contributions clipped to L2 norm 1, and adds N(0, σ²) noise per coordinate (σ is the
// noise multiplier: the noise's standard deviation over the clipping norm).
//
// References:
//   Mironov 2017, "Rényi Differential Privacy" (composition: RDP at each order adds up over
//     steps; Proposition 3, the classic conversion to (ε, δ)).
//   Mironov, Talwar and Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian
//     Mechanism" (arXiv:1908.10530): RDP of one step at integer orders (Sec. 3.2, a finite binomial
//     sum) and fractional orders (Sec. 3.3, two convergent series with erfc terms).
//   Balle, Barthe, Gaboardi, Hsu and Sato 2020, "Hypothesis Testing Interpretations and Rényi
//     Differential Privacy" (arXiv:1905.09982, Theorem 21): the tighter conversion used by
//     default, as Opacus's get_privacy_spent and TF Privacy's (dp_accounting's) compute_epsilon.
//
// Everything is computed in log space (log-sum-exp of the series' terms, log-binomials by
// recurrence, an asymptotic log erfc), so large orders and small σ give finite, accurate values.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shoal::privacy {

// How RDP at a set of orders becomes an (ε, δ) guarantee. Both take the best order.
enum class RdpConversion {
  // Balle et al. 2020, Theorem 21: ε = rdp(α) + log(1 - 1/α) - (log δ + log α) / (α - 1), and ε = 0
  // where the KL bound already gives δ (δ² > 1 - exp(-rdp)). Orders at or below 1.01 are skipped,
  // as dp_accounting does (the bound is unstable there and never the best). The default.
  kBalle2020,
  // Mironov 2017, Proposition 3: ε = rdp(α) + log(1/δ) / (α - 1). Looser; figures published
  // before 2020 (TF Privacy's MNIST tutorial) used it.
  kMironov2017,
};

// The (ε, δ) guarantee spent so far and the order that gave it.
struct PrivacySpent {
  double epsilon = 0;  // +infinity where no order gives a finite bound
  double order = 0;    // the best order; 0 where none (ε infinite, or no step taken)
};

// The orders TF Privacy's compute_dp_sgd_privacy evaluates: 1.25, 1.5, 1.75, 2, 2.25, 2.5, 3,
// 3.5, 4, 4.5, the integers 5 to 63, then 128, 256 and 512. They cover ε from about 0.1 to
// several hundred at δ between 1e-3 and 1e-10.
std::vector<double> DefaultRdpOrders();

// RDP of one step of the sampled Gaussian mechanism at each order (> 1), for sampling rate
// `sampling_rate` (q in [0, 1]) and noise multiplier `noise_multiplier` (σ ≥ 0). q = 0 gives 0;
// σ = 0 (with q > 0) gives +infinity, no privacy; q = 1 gives α / (2σ²). Multiply by a step
// count to compose. Errors: INVALID_ARGUMENT naming a value out of range. Thread-safe.
absl::StatusOr<std::vector<double>> SampledGaussianRdp(double sampling_rate,
                                                       double noise_multiplier,
                                                       absl::Span<const double> orders);

// The best (ε, δ) over `orders` for the composed RDP values `rdp` (same length) at `delta` in
// (0, 1). Errors: INVALID_ARGUMENT on mismatched lengths, an order ≤ 1, a negative or NaN RDP
// value, a δ outside (0, 1). Thread-safe.
absl::StatusOr<PrivacySpent> EpsilonFromRdp(absl::Span<const double> orders,
                                            absl::Span<const double> rdp, double delta,
                                            RdpConversion conversion = RdpConversion::kBalle2020);

struct RdpAccountantOptions {
  // Orders at which RDP is tracked; each finite and > 1, no repeats.
  std::vector<double> orders = DefaultRdpOrders();
  RdpConversion conversion = RdpConversion::kBalle2020;
};

// The privacy budget of one task: RDP at each order, summed over every step taken so far, so
// steps with different sampling rates and noise multipliers (a round that sampled fewer peers, a
// noise schedule) compose exactly. Its whole state is `orders()` and `rdp()` (plus a step
// count), which Restore() takes back: persist them so a restart never resets the budget.
// A value type owned by its task; not thread-safe (guard it, or copy it, to share).
class RdpAccountant {
 public:
  static absl::StatusOr<RdpAccountant> Create(RdpAccountantOptions options = {});
  // The accountant whose accumulated RDP is `rdp` (one value per option order) after `steps`
  // steps. Errors: INVALID_ARGUMENT on bad options, a length mismatch or a negative value.
  static absl::StatusOr<RdpAccountant> Restore(RdpAccountantOptions options,
                                               std::vector<double> rdp, int64_t steps);

  // Composes `steps` (≥ 0) steps at sampling rate q and noise multiplier σ. Errors:
  // INVALID_ARGUMENT naming the bad value; the state is unchanged then.
  absl::Status AddSteps(double sampling_rate, double noise_multiplier, int64_t steps);

  // The (ε, δ) spent so far at `delta` in (0, 1); ε = 0 before any step.
  absl::StatusOr<PrivacySpent> Spent(double delta) const;

  // How many more steps at (q, σ) keep ε at `delta` within `target_epsilon` (> 0): the largest
  // s with Spent(δ).epsilon ≤ target after AddSteps(q, σ, s). 0 when even one more step (or the
  // budget already spent) exceeds it; INT64_MAX when steps cost nothing (q = 0). Errors:
  // INVALID_ARGUMENT naming the bad value.
  absl::StatusOr<int64_t> StepsLeft(double sampling_rate, double noise_multiplier,
                                    double target_epsilon, double delta) const;

  const std::vector<double>& orders() const { return options_.orders; }
  const std::vector<double>& rdp() const { return rdp_; }
  RdpConversion conversion() const { return options_.conversion; }
  int64_t steps() const { return steps_; }

 private:
  RdpAccountant(RdpAccountantOptions options, std::vector<double> rdp, int64_t steps)
      : options_(std::move(options)), rdp_(std::move(rdp)), steps_(steps) {}

  RdpAccountantOptions options_;
  std::vector<double> rdp_;
  int64_t steps_ = 0;
};

}  // namespace shoal::privacy
