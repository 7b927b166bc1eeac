// krum and multi-krum (Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine
// Tolerant Gradient Descent"). Each update's score is the sum of its squared L2 distances to
// its K - f - 2 nearest other updates; krum keeps the update with the lowest score, multi-krum
// averages the m lowest (unweighted). Tolerates f Byzantine updates when K >= 2f + 3.

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "libs/aggregation/stored_updates.h"
#include "libs/aggregation/strategy_registry.h"

namespace shoal::aggregation::internal {
namespace {

using common::v1::AggregationOptions;

uint64_t KrumNeeds(uint64_t f) { return 2 * f + 3; }

// Squared distances of every pair, dist[a * k + b], in one pass over the updates: a tile of
// each update stays in cache while every pair uses it.
std::vector<double> PairwiseSquaredDistances(const SortedUpdates& updates, int threads) {
  const size_t k = updates.size();
  const size_t pairs = k * (k - 1) / 2;
  const size_t tile = std::max<size_t>(1024, (size_t{1} << 18) / k);
  std::vector<double> sums = StripedSums(
      updates.n, threads, pairs, [&updates, k, tile](size_t begin, size_t end, double* acc) {
        for (size_t start = begin; start < end; start += tile) {
          const size_t len = std::min(tile, end - start);
          size_t p = 0;
          for (size_t a = 0; a < k; ++a) {
            for (size_t b = a + 1; b < k; ++b, ++p) {
              acc[p] += SquaredDistance(updates.deltas[a] + start, updates.deltas[b] + start, len);
            }
          }
        }
      });
  std::vector<double> dist(k * k, 0.0);
  size_t p = 0;
  for (size_t a = 0; a < k; ++a) {
    for (size_t b = a + 1; b < k; ++b, ++p) dist[a * k + b] = dist[b * k + a] = sums[p];
  }
  return dist;
}

// Krum scores with f tolerated updates (k >= 2f + 3).
std::vector<double> Scores(const std::vector<double>& dist, size_t k, size_t f) {
  const size_t nearest = k - f - 2;
  std::vector<double> scores(k), others;
  for (size_t a = 0; a < k; ++a) {
    others.clear();
    for (size_t b = 0; b < k; ++b) {
      if (b != a) others.push_back(dist[a * k + b]);
    }
    std::partial_sort(others.begin(), others.begin() + nearest, others.end());
    double score = 0;
    for (size_t j = 0; j < nearest; ++j) score += others[j];
    scores[a] = score;
  }
  return scores;
}

// Owned by the round; not thread-safe (see Aggregation).
class KrumAggregation final : public StoredUpdates {
 public:
  // multi = false: krum (m = 1).
  KrumAggregation(tensor::ModelLayout layout, size_t expected_updates, int threads, bool multi,
                  const AggregationOptions& p)
      : StoredUpdates(std::move(layout), expected_updates, threads),
        multi_(multi),
        f_(p.byzantine_peers()),
        m_(p.has_multi_krum_selected() ? p.multi_krum_selected() : 0) {}

 private:
  AggregationReport CombineSorted(const SortedUpdates& updates, const float* base,
                                  float* out) const override {
    const char* name = multi_ ? "multi-krum" : "krum";
    const size_t k = updates.size();
    AggregationReport report;
    if (k < 3) {
      // No f fits: a score needs K - f - 2 >= 1 other update.
      CoordinateMedianInto(updates, threads(), base, out);
      report.note = absl::StrCat(
          name, ": ", k, " updates are too few (",
          f_ == 0 ? std::string("it needs at least 3")
                  : absl::StrCat("it needs 2f+3 = ", KrumNeeds(f_), " for byzantine_peers ", f_,
                                 ", at least 3 for any f"),
          "); used the coordinate-wise median");
      return report;
    }
    size_t f = f_;
    if (k < KrumNeeds(f_)) {
      f = (k - 3) / 2;  // the largest f with k >= 2f + 3
      report.note = absl::StrCat(name, ": ", k, " updates fit byzantine_peers ", f,
                                 ", not the configured ", f_, " (it needs 2f+3 updates)");
    }
    const std::vector<double> scores = Scores(PairwiseSquaredDistances(updates, threads()), k, f);
    size_t m = 1;
    if (multi_) {
      m = k - f;
      if (m_ > 0 && m_ <= m) {
        m = m_;
      } else if (m_ > m) {
        absl::StrAppend(&report.note, report.note.empty() ? "" : "; ", name, ": averaged ", m,
                        " updates (K - f), not the configured ", m_);
      }
    }
    // Lowest scores first; ties go to the smaller contributor id.
    std::vector<size_t> order(k);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&scores](size_t a, size_t b) { return scores[a] < scores[b]; });
    std::vector<size_t> chosen(order.begin(), order.begin() + m);
    std::sort(chosen.begin(), chosen.end());  // sum in id order
    for (size_t c : chosen) report.selected.emplace_back(updates.contributors[c]);

    std::vector<const float*> picked;
    for (size_t c : chosen) picked.push_back(updates.deltas[c]);
    const double count = static_cast<double>(m);
    ParallelFor(updates.n, threads(), [&picked, count, base, out](size_t begin, size_t end) {
      if (picked.size() == 1) {
        const float* d = picked[0];
        for (size_t i = begin; i < end; ++i) out[i] = base[i] + d[i];
        return;
      }
      for (size_t i = begin; i < end; ++i) {
        double sum = 0;
        for (const float* d : picked) sum += d[i];
        out[i] = base[i] + static_cast<float>(sum / count);
      }
    });
    return report;
  }

  bool multi_;
  size_t f_;
  size_t m_;  // 0: K - f
};

absl::Status ValidateKrum(const AggregationOptions& p) {
  if (!p.has_byzantine_peers()) {
    return absl::InvalidArgumentError(
        "byzantine_peers: required: f, the number of Byzantine updates a round tolerates (rounds "
        "need 2f+3 updates)");
  }
  if (p.has_multi_krum_selected() && p.multi_krum_selected() < 1) {
    return absl::InvalidArgumentError("multi_krum_selected: must be >= 1, got 0");
  }
  return absl::OkStatus();
}

MinUpdates KrumMinUpdates(const AggregationOptions& p) {
  const uint64_t f = p.byzantine_peers();
  MinUpdates need{KrumNeeds(f), absl::StrCat("2f+3 with byzantine_peers f = ", f)};
  if (p.has_multi_krum_selected() && p.multi_krum_selected() + f > need.updates) {
    need.updates = p.multi_krum_selected() + f;
    need.why = absl::StrCat("m+f with multi_krum_selected m = ", p.multi_krum_selected(),
                            " and byzantine_peers f = ", f);
  }
  return need;
}

}  // namespace

std::vector<StrategyDefinition> KrumStrategies() {
  StrategyDefinition krum;
  krum.kind = common::v1::AGGREGATION_KRUM;
  krum.params = {"byzantine_peers"};
  krum.validate = ValidateKrum;
  krum.min_updates = KrumMinUpdates;
  krum.start = [](tensor::ModelLayout layout, size_t expected_updates, int threads,
                  const AggregationOptions& p) -> std::unique_ptr<Aggregation> {
    return std::make_unique<KrumAggregation>(std::move(layout), expected_updates, threads,
                                             /*multi=*/false, p);
  };
  StrategyDefinition multi = krum;
  multi.kind = common::v1::AGGREGATION_MULTI_KRUM;
  multi.params = {"byzantine_peers", "multi_krum_selected"};
  multi.start = [](tensor::ModelLayout layout, size_t expected_updates, int threads,
                   const AggregationOptions& p) -> std::unique_ptr<Aggregation> {
    return std::make_unique<KrumAggregation>(std::move(layout), expected_updates, threads,
                                             /*multi=*/true, p);
  };
  return {krum, multi};
}

}  // namespace shoal::aggregation::internal
