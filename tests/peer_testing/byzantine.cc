#include "tests/peer_testing/byzantine.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal::testing {

absl::StatusOr<ByzantineFault> ByzantineFault::Parse(absl::string_view mode) {
  ByzantineFault fault;
  if (mode.empty()) return fault;
  double factor = -1;  // sign-flip
  const bool known =
      mode == "sign-flip" || (absl::StartsWith(mode, "scale:") &&
                              absl::SimpleAtod(mode.substr(6), &factor) && std::isfinite(factor));
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--test-byzantine: expected scale:FACTOR or sign-flip, got \"", EscapeBytes(mode), "\""));
  }
  fault.factor_ = factor;
  fault.mode_ = std::string(mode);
  return fault;
}

void ByzantineFault::CorruptDelta(std::vector<float>& delta) const {
  if (!active()) return;
  const float f = static_cast<float>(factor_);
  for (float& x : delta) x *= f;
}

absl::Status ByzantineFault::CorruptModel(const tensor::FlatModel& base,
                                          tensor::FlatModel& model) const {
  if (!active()) return absl::OkStatus();
  if (base.values.size() != model.values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot corrupt a model of ", model.values.size(),
                     " values against a base of ", base.values.size()));
  }
  const float f = static_cast<float>(factor_);
  for (size_t i = 0; i < model.values.size(); ++i) {
    model.values[i] = base.values[i] + f * (model.values[i] - base.values[i]);
  }
  return absl::OkStatus();
}

peer::UpdateHooks ByzantineFault::Hooks() const {
  peer::UpdateHooks hooks;
  if (!active()) return hooks;
  const ByzantineFault fault = *this;
  hooks.delta = [fault](std::vector<float>& delta) { fault.CorruptDelta(delta); };
  hooks.model = [fault](const tensor::FlatModel& base, tensor::FlatModel& model) {
    return fault.CorruptModel(base, model);
  };
  return hooks;
}

}  // namespace shoal::testing
