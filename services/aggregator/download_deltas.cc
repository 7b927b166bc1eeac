#include "services/aggregator/download_deltas.h"

#include <tuple>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/xor_delta.h"

namespace shoal::aggregator {

DownloadDeltas::DownloadDeltas(Executor& encoder, size_t max_tasks,
                               std::function<void(double)> on_encoded)
    : encoder_(encoder),
      max_tasks_(max_tasks < 1 ? 1 : max_tasks),
      shared_(std::make_shared<Shared>(std::move(on_encoded))) {}

DownloadDeltas::~DownloadDeltas() { Stop(); }

void DownloadDeltas::Stop() {
  absl::MutexLock lock(&shared_->mu);
  stopped_ = true;
  for (auto& [task, slot] : slots_) {
    if (slot.encoding != nullptr) slot.encoding->abandoned = true;
  }
}

DownloadDeltas::Download DownloadDeltas::Serve(const std::string& task, const ModelSnapshot& model,
                                               const absl::StatusOr<ModelSnapshot>& base) {
  Download download{tensor::EncodeRaw(model.model),
                    tensor::MakeModelMeta(task, model.version, *model.model)};
  if (!base.ok() || base->version == model.version) return download;
  std::function<void()> job;  // submitted with no lock held
  {
    absl::MutexLock lock(&shared_->mu);
    if (std::shared_ptr<const tensor::EncodedModel> encoded = Find(task, model, *base, job)) {
      download.payload = std::move(encoded);
      download.meta.set_xor_base_version(base->version);
      return download;
    }
  }
  Submit(std::move(job));
  return download;
}

std::shared_ptr<const tensor::EncodedModel> DownloadDeltas::Find(const std::string& task,
                                                                 const ModelSnapshot& model,
                                                                 const ModelSnapshot& base,
                                                                 std::function<void()>& job) {
  Slot& slot = slots_[task];
  slot.last_used = ++uses_;
  if (slots_.size() > max_tasks_) {
    auto oldest = slots_.begin();
    for (auto it = slots_.begin(); it != slots_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    if (oldest->second.encoding != nullptr) oldest->second.encoding->abandoned = true;
    slots_.erase(oldest);  // never `slot`: it was used last
  }
  const Encoding* encoding = slot.encoding.get();
  if (encoding != nullptr && encoding->version == model.version &&
      encoding->base_version == base.version) {
    return encoding->encoded;  // null while it is being made (or when it could not be)
  }
  // None for this version and base: made now for the next downloads, unless the slot's is of a
  // newer version (or base), which an older request must not abandon.
  if (encoding == nullptr || std::make_tuple(encoding->version, encoding->base_version) <
                                 std::make_tuple(model.version, base.version)) {
    job = Start(slot, model, base);
  }
  return nullptr;
}

void DownloadDeltas::Prepare(const std::string& task, const ModelSnapshot& model,
                             const ModelSnapshot& base) {
  std::function<void()> job;
  {
    absl::MutexLock lock(&shared_->mu);
    auto it = slots_.find(task);
    if (it == slots_.end()) return;  // no peer of the task downloads against a held version
    const Encoding* encoding = it->second.encoding.get();
    if (encoding != nullptr && encoding->version >= model.version) return;
    job = Start(it->second, model, base);
  }
  Submit(std::move(job));
}

void DownloadDeltas::Release(const std::string& task) {
  absl::MutexLock lock(&shared_->mu);
  auto it = slots_.find(task);
  if (it == slots_.end()) return;
  if (it->second.encoding != nullptr) it->second.encoding->abandoned = true;
  slots_.erase(it);
}

std::function<void()> DownloadDeltas::Start(Slot& slot, const ModelSnapshot& model,
                                            const ModelSnapshot& base) {
  if (slot.encoding != nullptr) slot.encoding->abandoned = true;
  if (stopped_) {
    slot.encoding.reset();
    return nullptr;
  }
  // The old encoding's memory goes once no download streams it any more.
  slot.encoding = std::make_shared<Encoding>(model.version, base.version);
  // A pass over both models, on the encoder; it holds them (not this object) while it runs.
  return [shared = shared_, encoding = slot.encoding, model, base] {
    if (encoding->abandoned) return;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> encoded = tensor::EncodeXorDelta(
        model.model, *base.model, [&encoding] { return !encoding->abandoned; });
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    {
      absl::MutexLock lock(&shared->mu);
      if (encoded.ok() && !encoding->abandoned) encoding->encoded = *std::move(encoded);
    }
    if (encoded.ok() && shared->on_encoded) shared->on_encoded(seconds);
  };
}

void DownloadDeltas::Submit(std::function<void()> job) {
  // Refused (the encoder is full or shut down): that encoding is never ready and its version goes
  // raw; the next version's gets its own try.
  if (job != nullptr) static_cast<void>(encoder_.TrySubmit(std::move(job)));
}

}  // namespace shoal::aggregator
