#include "services/coordinator/modes/decentralized/decentralized_round.h"

namespace shoal::coordinator {

void DecentralizedRound::ReopenJoins() {
  joins_open = true;
  participants.clear();
  reports.clear();
  done.clear();
  held.clear();
  unmasking = false;
  reveals.clear();
  revealed = false;
  stage_deadline = absl::InfiniteFuture();
}

v1::RoundSummary DecentralizedRound::Summary(absl::Time now, bool& digests_differ) const {
  v1::RoundSummary summary;
  summary.set_round(number);
  summary.set_model_version(number);
  uint64_t samples = 0;
  double loss_sum = 0;
  double plain_loss_sum = 0;
  std::set<uint64_t> digests;
  for (const std::string& id : participants) {
    summary.add_participants(id);
    auto r = ready.find(id);
    const Ready mine = r == ready.end() ? Ready{} : r->second;
    samples += mine.num_samples;
    loss_sum += mine.train_loss * static_cast<double>(mine.num_samples);
    plain_loss_sum += mine.train_loss;
    auto d = done.find(id);
    digests.insert(d == done.end() ? 0 : d->second.digest);
  }
  for (const std::string& id : dropped) {
    if (!participants.count(id)) summary.add_dropped(id);
  }
  summary.set_num_samples(samples);
  if (samples > 0) {
    summary.set_mean_train_loss(loss_sum / static_cast<double>(samples));
  } else if (!participants.empty()) {
    summary.set_mean_train_loss(plain_loss_sum / static_cast<double>(participants.size()));
  }
  digests_differ = digests.size() > 1;
  if (!participants.empty()) {
    auto d = done.find(*participants.begin());
    summary.set_model_digest(d == done.end() ? 0 : d->second.digest);
  }
  summary.set_joins(joins);
  summary.set_leaves(leaves);
  summary.set_connection_retries(total_retries);
  for (const std::string& id : removed) summary.add_removed(id);
  summary.set_duration_ms(absl::ToInt64Milliseconds(now - opened));
  summary.set_overhead_ms(absl::ToInt64Milliseconds(now - first_ready.value_or(now)));
  return summary;
}

}  // namespace shoal::coordinator
