#include "services/aggregator/download_deltas.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/xor_delta.h"

namespace shoal::aggregator {

void DownloadDeltas::Serve(const std::string& task, const ModelSnapshot& model,
                           const absl::StatusOr<ModelSnapshot>& base, Executor& executor,
                           Send send) {
  const common::v1::ModelMeta meta = tensor::MakeModelMeta(task, model.version, *model.model);
  if (!base.ok() || base->version == model.version) {
    send(tensor::EncodeRaw(model.model), meta);
    return;
  }
  // A pass over both models, once per version and base, off the caller's thread.
  auto encode = [this, task, model, base = *base, meta, send] {
    absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> encoded = Get(task, model, base);
    if (!encoded.ok()) {
      send(tensor::EncodeRaw(model.model), meta);
      return;
    }
    common::v1::ModelMeta against = meta;
    against.set_xor_base_version(base.version);
    send(*std::move(encoded), against);
  };
  if (!executor.TrySubmit(encode)) send(tensor::EncodeRaw(model.model), meta);
}

absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> DownloadDeltas::Get(
    const std::string& task, const ModelSnapshot& model, const ModelSnapshot& base) {
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    Slot& slot = entries_[task];
    if (slot.entry == nullptr) slot.entry = std::make_shared<Entry>();
    slot.last_used = ++uses_;
    entry = slot.entry;
    while (entries_.size() > max_tasks_) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.last_used < oldest->second.last_used) oldest = it;
      }
      entries_.erase(oldest);
    }
  }
  absl::MutexLock lock(&entry->mu);
  if (entry->encoded != nullptr && entry->version == model.version &&
      entry->base_version == base.version) {
    return entry->encoded;
  }
  entry->encoded.reset();  // the old encoding's memory goes before the new one is made
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> encoded =
      tensor::EncodeXorDelta(model.model, *base.model);
  if (!encoded.ok()) return encoded.status();
  if (on_encoded_) on_encoded_(absl::ToDoubleSeconds(absl::Now() - start));
  entry->version = model.version;
  entry->base_version = base.version;
  entry->encoded = *encoded;
  return encoded;
}

}  // namespace shoal::aggregator
