#include "services/coordinator/round_lists.h"

#include <algorithm>
#include <string>

#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"

namespace shoal::coordinator {
namespace {

using google::protobuf::FieldMask;
using google::protobuf::util::FieldMaskUtil;

// Every field of RoundSummary but its per-peer lists (fields added later are included).
const FieldMask& AllButLists() {
  static const FieldMask* mask = [] {
    auto* m = new FieldMask;
    const google::protobuf::Descriptor* d = v1::RoundSummary::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const std::string& name = d->field(i)->name();
      if (name != "participants" && name != "dropped" && name != "late" && name != "peer_times") {
        m->add_paths(name);
      }
    }
    return m;
  }();
  return *mask;
}

}  // namespace

size_t ListEntries(const v1::RoundSummary& round) {
  return static_cast<size_t>(round.participants_size()) + round.dropped_size() + round.late_size() +
         round.peer_times_size();
}

void SetCounts(const v1::RoundSummary& from, v1::RoundSummary& to) {
  to.set_participant_count(static_cast<uint32_t>(from.participants_size()));
  to.set_dropped_count(static_cast<uint32_t>(from.dropped_size()));
  to.set_late_count(static_cast<uint32_t>(from.late_size()));
}

void AppendRounds(const google::protobuf::RepeatedPtrField<v1::RoundSummary>& rounds, size_t budget,
                  google::protobuf::RepeatedPtrField<v1::RoundSummary>* out) {
  // Newest first: where the lists stop fitting.
  int first_full = rounds.size();
  size_t used = 0;
  while (first_full > 0) {
    const size_t n = ListEntries(rounds[first_full - 1]);
    if (used + n > budget) break;
    used += n;
    --first_full;
  }
  out->Reserve(out->size() + rounds.size());
  for (int i = 0; i < rounds.size(); ++i) {
    const v1::RoundSummary& r = rounds[i];
    v1::RoundSummary* copy = out->Add();
    if (i >= first_full) {
      *copy = r;
    } else {
      FieldMaskUtil::MergeMessageTo(r, AllButLists(), FieldMaskUtil::MergeOptions(), copy);
      copy->set_lists_omitted(true);
    }
    SetCounts(r, *copy);
  }
}

uint64_t CompletedRounds(const v1::TaskStatus& status) {
  uint64_t completed = status.model_version();
  for (const v1::RoundSummary& r : status.history()) {
    completed = std::max(completed, r.model_version());
  }
  return completed;
}

}  // namespace shoal::coordinator
