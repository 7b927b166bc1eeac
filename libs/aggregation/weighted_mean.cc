#include "libs/aggregation/weighted_mean.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libs/common/parallel_for.h"

namespace shoal::aggregation {

using common::ParallelFor;

namespace {

// kExact's bounds: terms under 2^40 (2^104 units), at most 2^22 of them: |sum| < 2^126.
constexpr double kMaxExactTerm = 0x1p40;
constexpr size_t kMaxExactTerms = size_t{1} << 22;

// w x d rounded toward zero to units of 2^-64; |w x d| < kMaxExactTerm. The same value as
// static_cast<ExactValue>(product * 0x1p64), from two hardware conversions instead of that
// 128-bit one (a library call that made a fold 2x slower): product x 2^23 fits an int64, and
// its integer part and the rest (exact, of the same sign) give the units above and below 2^41.
inline ExactValue ExactTerm(double product) {
  const double scaled = product * 0x1p23;
  const int64_t high = static_cast<int64_t>(scaled);
  const int64_t low = static_cast<int64_t>((scaled - static_cast<double>(high)) * 0x1p41);
  return static_cast<ExactValue>(high) * (ExactValue{1} << 41) + low;
}

double ToDouble(ExactValue units) { return static_cast<double>(units) * 0x1p-64; }

}  // namespace

WeightedMeanAccumulator::WeightedMeanAccumulator(tensor::ModelLayout layout, int threads,
                                                 Summation summation)
    : layout_(std::move(layout)), threads_(threads), summation_(summation) {}

double WeightedMeanAccumulator::total_weight() const {
  return summation_ == Summation::kExact ? ToDouble(exact_weight_) : total_weight_;
}

absl::Status WeightedMeanAccumulator::Add(absl::Span<const float> delta, double weight) {
  if (delta.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta has ", delta.size(), " values; the model has ", layout_.total_elements()));
  }
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("update weight ", weight, " must be > 0"));
  }
  const size_t n = delta.size();
  const float* d = delta.data();
  if (summation_ == Summation::kExact) {
    if (!(weight < kMaxExactTerm)) {
      return absl::InvalidArgumentError(
          absl::StrCat("update weight ", weight, " is over exact summation's bound 2^40"));
    }
    if (count_ + 1 > kMaxExactTerms) {
      return absl::InvalidArgumentError(
          absl::StrCat("exact summation holds at most ", kMaxExactTerms, " updates"));
    }
    // Every term is checked before any is added, so a refused update leaves the sum as it was
    // (a read of the floats: cheap beside the fold's 16-byte read-modify-write).
    for (size_t i = 0; i < n; ++i) {
      if (!(std::fabs(weight * static_cast<double>(d[i])) < kMaxExactTerm)) {
        return absl::InvalidArgumentError(
            absl::StrCat("value ", d[i], " at ", layout_.DescribeElement(i), " times weight ",
                         weight, " is over exact summation's bound 2^40"));
      }
    }
    const bool first = count_ == 0;
    if (first) exact_.resize(n);
    ExactValue* e = exact_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const ExactValue term = ExactTerm(weight * static_cast<double>(d[i]));
        e[i] = first ? term : e[i] + term;
      }
    });
    ++count_;
    exact_weight_ += ExactTerm(weight);
    return absl::OkStatus();
  }
  const float w = static_cast<float>(weight);
  if (count_ == 0) {
    sum_.resize(n);
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] = w * d[i];
    });
  } else {
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] += w * d[i];
    });
  }
  ++count_;
  total_weight_ += weight;
  return absl::OkStatus();
}

absl::Status WeightedMeanAccumulator::AddTaking(std::vector<float>& delta, double weight) {
  if (summation_ != Summation::kFloat || count_ > 0) return Add(delta, weight);
  if (delta.size() != layout_.total_elements() || !(weight > 0) || !std::isfinite(weight)) {
    return Add(delta, weight);  // its error
  }
  // The same products as Add's first term, written where they are (none for a weight of 1,
  // as differential privacy's rounds weigh every update: 1 x d is d).
  const float w = static_cast<float>(weight);
  if (w != 1.0f) {
    float* d = delta.data();
    ParallelFor(delta.size(), threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) d[i] = w * d[i];
    });
  }
  sum_.swap(delta);
  count_ = 1;
  total_weight_ = weight;
  return absl::OkStatus();
}

absl::Status WeightedMeanAccumulator::AddNoiseTerm(absl::Span<const float> noise, double weight) {
  if (summation_ != Summation::kFloat) {
    return absl::InvalidArgumentError("a noise term needs float summation (not exact_sum)");
  }
  if (count_ == 0) return absl::InvalidArgumentError("a noise term needs at least one update");
  if (!(weight >= 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("noise term weight ", weight, " must be >= 0"));
  }
  const size_t n = layout_.total_elements();
  if (!noise.empty()) {
    if (noise.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("noise has ", noise.size(), " values; the model has ", n));
    }
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(noise[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("noise value at ", layout_.DescribeElement(i), " is not finite"));
      }
    }
    const float* p = noise.data();
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] += p[i];
    });
  }
  total_weight_ += weight;
  return absl::OkStatus();
}

absl::Status WeightedMeanAccumulator::AddPartial(const PartialSum& partial) {
  const size_t n = layout_.total_elements();
  if (partial.summation != summation_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the partial sum is ", partial.summation == Summation::kExact ? "exact" : "float",
        "; this sum is ", summation_ == Summation::kExact ? "exact" : "float"));
  }
  if (partial.count == 0) return absl::OkStatus();
  if (summation_ == Summation::kExact) {
    if (partial.exact.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("partial sum has ", partial.exact.size(), " values; the model has ", n));
    }
    if (count_ + partial.count > kMaxExactTerms) {
      return absl::InvalidArgumentError(
          absl::StrCat("exact summation holds at most ", kMaxExactTerms, " updates"));
    }
    if (!(partial.exact_weight > 0)) {
      return absl::InvalidArgumentError("partial sum's weight must be > 0");
    }
    // Each value of a partial of c terms is under c x 2^104 units: anything larger is not a
    // partial sum, and adding it could overflow.
    const ExactValue bound = static_cast<ExactValue>(partial.count) << 104;
    for (size_t i = 0; i < n; ++i) {
      if (partial.exact[i] >= bound || partial.exact[i] <= -bound) {
        return absl::InvalidArgumentError(
            absl::StrCat("partial sum value at ", layout_.DescribeElement(i),
                         " is over the bound of ", partial.count, " terms"));
      }
    }
    if (partial.exact_weight >= bound) {
      return absl::InvalidArgumentError(
          absl::StrCat("partial sum's weight is over the bound of ", partial.count, " terms"));
    }
    const ExactValue* p = partial.exact.data();
    if (count_ == 0) {
      exact_.assign(partial.exact.begin(), partial.exact.end());
    } else {
      ExactValue* e = exact_.data();
      ParallelFor(n, threads_, [=](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) e[i] += p[i];
      });
    }
    count_ += partial.count;
    exact_weight_ += partial.exact_weight;
    return absl::OkStatus();
  }
  if (partial.sum.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial sum has ", partial.sum.size(), " values; the model has ", n));
  }
  if (!(partial.total_weight > 0) || !std::isfinite(partial.total_weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial sum's weight ", partial.total_weight, " must be > 0"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(partial.sum[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("partial sum value at ", layout_.DescribeElement(i), " is not finite"));
    }
  }
  const float* p = partial.sum.data();
  if (count_ == 0) {
    sum_.assign(partial.sum.begin(), partial.sum.end());
  } else {
    float* s = sum_.data();
    ParallelFor(n, threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) s[i] += p[i];
    });
  }
  count_ += partial.count;
  total_weight_ += partial.total_weight;
  return absl::OkStatus();
}

PartialSum WeightedMeanAccumulator::Partial() const {
  PartialSum partial;
  partial.summation = summation_;
  partial.count = count_;
  if (count_ == 0) return partial;
  if (summation_ == Summation::kExact) {
    partial.exact = exact_;
    partial.exact_weight = exact_weight_;
  } else {
    partial.sum = sum_;
  }
  partial.total_weight = total_weight();
  return partial;
}

absl::StatusOr<tensor::FlatModel> WeightedMeanAccumulator::Apply(
    const tensor::FlatModel& base) const {
  tensor::FlatModel out;
  absl::Status s = ApplyInto(base, out.values);
  if (!s.ok()) return s;
  out.layout = layout_;
  return out;
}

absl::Status WeightedMeanAccumulator::ApplyInto(const tensor::FlatModel& base,
                                                std::vector<float>& out) const {
  if (!(base.layout == layout_) || base.values.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError("base model does not match the accumulator's layout");
  }
  if (count_ == 0) {
    out.assign(base.values.begin(), base.values.end());
    return absl::OkStatus();
  }
  out.resize(base.values.size());
  const float* b = base.values.data();
  float* o = out.data();
  if (summation_ == Summation::kExact) {
    // Both in units of 2^-64: the ratio is the mean. Each conversion depends on the integers
    // alone, so equal sums give equal models.
    const double scale = 1.0 / static_cast<double>(exact_weight_);
    const ExactValue* e = exact_.data();
    ParallelFor(out.size(), threads_, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        o[i] = b[i] + static_cast<float>(static_cast<double>(e[i]) * scale);
      }
    });
    return absl::OkStatus();
  }
  const float scale = static_cast<float>(1.0 / total_weight_);
  const float* s = sum_.data();
  ParallelFor(out.size(), threads_, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) o[i] = b[i] + s[i] * scale;
  });
  return absl::OkStatus();
}

absl::Status WeightedMeanAccumulator::ApplyInPlace(const tensor::FlatModel& base,
                                                   std::vector<float>& out) {
  if (summation_ != Summation::kFloat || count_ == 0) {
    absl::Status s = ApplyInto(base, out);
    if (s.ok()) Reset();
    return s;
  }
  if (!(base.layout == layout_) || base.values.size() != layout_.total_elements()) {
    return absl::InvalidArgumentError("base model does not match the accumulator's layout");
  }
  // ApplyInto's expression, element by element over the sum itself.
  const float scale = static_cast<float>(1.0 / total_weight_);
  const float* b = base.values.data();
  float* s = sum_.data();
  ParallelFor(sum_.size(), threads_, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) s[i] = b[i] + s[i] * scale;
  });
  out.swap(sum_);
  Reset();
  return absl::OkStatus();
}

float WeightedMeanAccumulator::MeanAt(size_t i) const {
  if (summation_ == Summation::kExact) {
    return static_cast<float>(static_cast<double>(exact_[i]) / static_cast<double>(exact_weight_));
  }
  return sum_[i] * static_cast<float>(1.0 / total_weight_);
}

std::vector<float> WeightedMeanAccumulator::MeanDelta() const {
  std::vector<float> out(layout_.total_elements(), 0.0f);
  if (count_ == 0) return out;
  for (size_t i = 0; i < out.size(); ++i) out[i] = MeanAt(i);
  return out;
}

void WeightedMeanAccumulator::Reset() {
  count_ = 0;
  total_weight_ = 0;
  exact_weight_ = 0;
}

}  // namespace shoal::aggregation
