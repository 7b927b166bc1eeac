#pragma once

// Fault injection of the peer's test build (shoal-peer-testing --test-byzantine MODE): a
// Byzantine peer for tests of robust aggregation. It corrupts what this peer contributes to the
// others, never the copy of the global model it keeps for itself (through peer::UpdateHooks).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/peer_hooks.h"

namespace shoal::testing {

// How this peer corrupts its contribution: its delta d (trained model minus the model the round
// started from) becomes factor · d. "scale:F" sets factor F, "sign-flip" factor −1. A value
// type (thread-compatible); inactive (honest) by default.
class ByzantineFault {
 public:
  ByzantineFault() = default;
  // Parses MODE: "scale:FACTOR" (a finite number) or "sign-flip"; "" is the honest default.
  // Errors: INVALID_ARGUMENT starting with "--test-byzantine".
  static absl::StatusOr<ByzantineFault> Parse(absl::string_view mode);

  bool active() const { return !mode_.empty(); }
  double factor() const { return factor_; }
  // The MODE it was parsed from ("" when honest).
  const std::string& mode() const { return mode_; }

  // Federated-sync and federated-async: the delta pushed to the aggregator, in place (models
  // are large).
  void CorruptDelta(std::vector<float>& delta) const;
  // Decentralized: the round update the others fetch (and that every participant, this one
  // included, aggregates), `model` = base + factor · (model − base), in place.
  // INVALID_ARGUMENT when the sizes differ.
  absl::Status CorruptModel(const tensor::FlatModel& base, tensor::FlatModel& model) const;

  // The peer's hooks doing both (copies of this fault); empty hooks when honest.
  peer::UpdateHooks Hooks() const;

 private:
  double factor_ = 1;
  std::string mode_;
};

}  // namespace shoal::testing
