#include "services/coordinator/peer_data.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

absl::Status RecordPeerData(v1::TaskStatus& status, const std::string& peer_id,
                            const v1::DataReport& report) {
  if (report.label_histogram_size() > kMaxHistogramClasses) {
    return absl::InvalidArgumentError(absl::StrCat("data report: ", report.label_histogram_size(),
                                                   " classes, over the limit of ",
                                                   kMaxHistogramClasses));
  }
  // sum <= train_samples throughout, so neither the subtraction nor the sum can wrap.
  uint64_t sum = 0;
  bool over = false;
  for (uint64_t count : report.label_histogram()) {
    if (count > report.train_samples() - sum) {
      over = true;
      break;
    }
    sum += count;
  }
  if (report.label_histogram_size() > 0 && (over || sum != report.train_samples())) {
    return absl::InvalidArgumentError(
        absl::StrCat("data report: the label histogram does not add up to train_samples ",
                     report.train_samples()));
  }
  auto* data = status.mutable_data();
  auto it = std::lower_bound(
      data->begin(), data->end(), peer_id,
      [](const v1::PeerData& d, const std::string& id) { return d.peer_id() < id; });
  v1::PeerData* entry;
  if (it != data->end() && it->peer_id() == peer_id) {
    entry = &*it;
  } else {
    const int index = static_cast<int>(it - data->begin());
    data->Add();
    for (int i = data->size() - 1; i > index; --i) data->SwapElements(i, i - 1);
    entry = data->Mutable(index);
  }
  entry->Clear();
  entry->set_peer_id(peer_id);
  entry->set_train_samples(report.train_samples());
  entry->set_test_samples(report.test_samples());
  *entry->mutable_label_histogram() = report.label_histogram();
  return absl::OkStatus();
}

void ForgetPeerData(v1::TaskStatus& status, const std::string& peer_id) {
  auto* data = status.mutable_data();
  for (int i = 0; i < data->size(); ++i) {
    if (data->Get(i).peer_id() != peer_id) continue;
    data->DeleteSubrange(i, 1);
    return;
  }
}

}  // namespace shoal::coordinator
