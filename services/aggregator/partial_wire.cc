#include "services/aggregator/partial_wire.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/tensor/flat_model.h"

namespace shoal::aggregator {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "partial sums travel in the host's layout, which must be little-endian");
static_assert(sizeof(aggregation::ExactValue) == 16);

using aggregation::ExactValue;
using aggregation::PartialSum;
using aggregation::Summation;

namespace {

std::string ExactBytes(ExactValue v) {
  std::string out(sizeof v, '\0');
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}

}  // namespace

absl::string_view PartialBytes(const PartialSum& sum) {
  if (sum.summation == Summation::kExact) {
    return {reinterpret_cast<const char*>(sum.exact.data()), sum.exact.size() * sizeof(ExactValue)};
  }
  return {reinterpret_cast<const char*>(sum.sum.data()), sum.sum.size() * sizeof(float)};
}

v1::PartialMeta PartialMetaFor(const PartialResult& partial, const std::string& child) {
  v1::PartialMeta meta;
  meta.set_task(partial.meta.task);
  meta.set_round(partial.meta.round);
  meta.set_child(child);
  meta.set_base_version(partial.meta.base_version);
  for (const std::string& c : partial.meta.contributors) meta.add_contributors(c);
  meta.set_num_samples(partial.meta.num_samples);
  meta.set_loss_sum(partial.meta.loss_sum);
  const PartialSum& sum = partial.sum;
  meta.set_exact(sum.summation == Summation::kExact);
  meta.set_total_weight(sum.total_weight);
  if (sum.summation == Summation::kExact) meta.set_exact_weight(ExactBytes(sum.exact_weight));
  meta.set_values(sum.summation == Summation::kExact ? sum.exact.size() : sum.sum.size());
  const absl::string_view bytes = PartialBytes(sum);
  meta.set_digest_xxh3(tensor::DigestBytes(bytes.data(), bytes.size()));
  return meta;
}

absl::StatusOr<PartialReceiver> PartialReceiver::Start(const v1::PartialMeta& meta, size_t values) {
  const std::string what = absl::StrCat("partial sum of round ", meta.round());
  const size_t count = static_cast<size_t>(meta.contributors_size());
  PartialReceiver r;
  PartialSum& sum = r.result_.sum;
  sum.summation = meta.exact() ? Summation::kExact : Summation::kFloat;
  sum.count = count;
  if (count == 0) {
    // A child none of whose peers pushed: nothing follows.
    if (meta.values() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has no contributors but ", meta.values(), " values"));
    }
  } else if (meta.values() != values) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", meta.values(), " values; the model has ", values));
  }
  if (meta.exact()) {
    if (meta.exact_weight().size() != sizeof(ExactValue)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": exact_weight has ", meta.exact_weight().size(), " bytes, not 16"));
    }
    std::memcpy(&sum.exact_weight, meta.exact_weight().data(), sizeof(ExactValue));
    sum.exact.resize(count == 0 ? 0 : values);
    r.size_ = sum.exact.size() * sizeof(ExactValue);
  } else {
    if (count > 0 && (!(meta.total_weight() > 0) || !std::isfinite(meta.total_weight()))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": total_weight ", meta.total_weight(), " must be > 0"));
    }
    sum.sum.resize(count == 0 ? 0 : values);
    r.size_ = sum.sum.size() * sizeof(float);
  }
  sum.total_weight = meta.total_weight();
  PartialMeta& m = r.result_.meta;
  m.task = meta.task();
  m.round = meta.round();
  m.child = meta.child();
  m.base_version = meta.base_version();
  m.contributors.assign(meta.contributors().begin(), meta.contributors().end());
  m.num_samples = meta.num_samples();
  m.loss_sum = meta.loss_sum();
  r.digest_ = meta.digest_xxh3();
  return r;
}

char* PartialReceiver::data() {
  PartialSum& sum = result_.sum;
  return sum.summation == Summation::kExact ? reinterpret_cast<char*>(sum.exact.data())
                                            : reinterpret_cast<char*>(sum.sum.data());
}

absl::Status PartialReceiver::Add(absl::string_view chunk) {
  if (chunk.size() > size_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat("partial sum of round ", result_.meta.round,
                                                   " carries more than its ", size_, " bytes"));
  }
  if (!chunk.empty()) std::memcpy(data() + received_, chunk.data(), chunk.size());
  received_ += chunk.size();
  return absl::OkStatus();
}

absl::StatusOr<PartialResult> PartialReceiver::Finish() && {
  const std::string what = absl::StrCat("partial sum of round ", result_.meta.round);
  if (received_ != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ended after ", received_, " of its ", size_, " bytes"));
  }
  if (tensor::DigestBytes(data(), size_) != digest_) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": digest mismatch"));
  }
  return std::move(result_);
}

}  // namespace shoal::aggregator
