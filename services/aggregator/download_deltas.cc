#include "services/aggregator/download_deltas.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/time/clock.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/xor_delta.h"

namespace shoal::aggregator {
namespace {

// The blocks an encoding of `layout` passes over (EncodeXorDelta asks keep_going before each).
uint64_t Blocks(const tensor::ModelLayout& layout) {
  uint64_t blocks = 0;
  for (const auto& spec : layout.tensors()) {
    const auto n = static_cast<uint64_t>(spec.NumElements());
    blocks += (n + tensor::kXorBlockValues - 1) / tensor::kXorBlockValues;
  }
  return blocks;
}

}  // namespace

DownloadDeltas::DownloadDeltas(Executor& encoder, size_t max_tasks,
                               std::function<void(double)> on_encoded, int encode_threads)
    : encoder_(encoder),
      max_tasks_(max_tasks < 1 ? 1 : max_tasks),
      shared_(std::make_shared<Shared>(std::move(on_encoded), encode_threads)) {}

DownloadDeltas::~DownloadDeltas() { Stop(); }

void DownloadDeltas::Stop() {
  absl::MutexLock lock(&shared_->mu);
  stopped_ = true;
  for (auto& [task, slot] : slots_) {
    if (slot.encoding != nullptr) slot.encoding->abandoned = true;
  }
}

void DownloadDeltas::Serve(const std::string& task, const std::string& peer,
                           const ModelSnapshot& model, const absl::StatusOr<ModelSnapshot>& base,
                           Send send) {
  common::v1::ModelMeta meta = tensor::MakeModelMeta(task, model.version, *model.model);
  if (!base.ok() || base->version == model.version) {
    send(model.Raw(), meta);
    return;
  }
  // Sends the encoding when there is one, else the model raw.
  Waiter answer = [send, model, meta, base_version = base->version](
                      std::shared_ptr<const tensor::EncodedModel> encoded) {
    if (encoded == nullptr) {
      send(model.Raw(), meta);
      return;
    }
    common::v1::ModelMeta against = meta;
    against.set_xor_base_version(base_version);
    send(std::move(encoded), against);
  };
  Job job;                 // submitted with no lock held
  Waiter waiter = answer;  // cleared when queued on the encoding
  std::shared_ptr<const tensor::EncodedModel> encoded;
  {
    absl::MutexLock lock(&shared_->mu);
    encoded = Find(task, peer, model, *base, job, waiter);
  }
  Submit(std::move(job));
  if (waiter != nullptr) answer(std::move(encoded));
}

void DownloadDeltas::Downloaded(const std::string& task, const std::string& peer, uint64_t bytes,
                                absl::Duration seconds) {
  if (bytes == 0 || seconds <= absl::ZeroDuration()) return;
  SetRate(task, peer, static_cast<double>(bytes) / absl::ToDoubleSeconds(seconds));
}

void DownloadDeltas::Reported(const std::string& task, const std::string& peer,
                              double bytes_per_second) {
  if (!std::isfinite(bytes_per_second) || bytes_per_second <= 0) return;
  SetRate(task, peer, bytes_per_second);
}

void DownloadDeltas::KeepPeers(const std::string& task, const std::set<std::string>& members) {
  absl::MutexLock lock(&shared_->mu);
  auto rates = rates_.find(task);
  if (rates == rates_.end()) return;
  for (auto it = rates->second.begin(); it != rates->second.end();) {
    it = members.count(it->first) > 0 ? std::next(it) : rates->second.erase(it);
  }
}

void DownloadDeltas::SetRate(const std::string& task, const std::string& peer,
                             double bytes_per_second) {
  if (peer.empty()) return;
  absl::MutexLock lock(&shared_->mu);
  if (rates_.find(task) == rates_.end() && rates_.size() >= 4 * max_tasks_) {
    rates_.erase(rates_.begin());  // bounded: the tasks of a long-running aggregator come and go
  }
  rates_[task][peer] = bytes_per_second;
}

std::shared_ptr<const tensor::EncodedModel> DownloadDeltas::Find(const std::string& task,
                                                                 const std::string& peer,
                                                                 const ModelSnapshot& model,
                                                                 const ModelSnapshot& base,
                                                                 Job& job, Waiter& waiter) {
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
  Encoding* encoding = slot.encoding.get();
  if (encoding == nullptr || encoding->version != model.version ||
      encoding->base_version != base.version) {
    // None for this version and base: made now, unless the slot's is of a newer version (or
    // base), which an older request must not abandon.
    if (encoding != nullptr && std::make_tuple(encoding->version, encoding->base_version) >=
                                   std::make_tuple(model.version, base.version)) {
      return nullptr;
    }
    if (!Pays(slot, task)) return nullptr;
    job = Start(slot, model, base);
    if (job.run == nullptr) return nullptr;
    encoding = slot.encoding.get();
  }
  if (encoding->encoded != nullptr || encoding->finished) return encoding->encoded;
  if (Waits(slot, *encoding, task, peer, model)) {
    encoding->waiters.push_back(std::move(waiter));
    waiter = nullptr;
  }
  return nullptr;
}

bool DownloadDeltas::Waits(const Slot& slot, const Encoding& encoding, const std::string& task,
                           const std::string& peer, const ModelSnapshot& model) const {
  auto rates = rates_.find(task);
  if (rates == rates_.end()) return false;
  auto rate = rates->second.find(peer);
  if (rate == rates->second.end()) return false;  // not measured yet: raw
  const double raw_bytes = static_cast<double>(model.model->layout.total_bytes());
  const double saved_seconds = raw_bytes * (1.0 - slot.encoded_ratio) / rate->second;
  // Its remaining time: from its progress once it has some, else at the task's last speed.
  double remaining = raw_bytes / slot.encode_bytes_per_second;
  const uint64_t done = encoding.blocks_done;
  if (encoding.started != absl::InfiniteFuture()) {
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - encoding.started);
    remaining = done > 0 ? elapsed * static_cast<double>(encoding.blocks - done) / done
                         : remaining - elapsed;
  }
  return remaining < saved_seconds;
}

void DownloadDeltas::Prepare(const std::string& task, const ModelSnapshot& model,
                             const ModelSnapshot& base) {
  Job job;
  {
    absl::MutexLock lock(&shared_->mu);
    auto it = slots_.find(task);
    if (it == slots_.end()) return;  // no peer of the task downloads against a held version
    const Encoding* encoding = it->second.encoding.get();
    if (encoding != nullptr && encoding->version >= model.version) return;
    if (!Pays(it->second, task)) {
      Retire(it->second);
      return;
    }
    job = Start(it->second, model, base);
  }
  Submit(std::move(job));
}

void DownloadDeltas::Release(const std::string& task) {
  absl::MutexLock lock(&shared_->mu);
  rates_.erase(task);
  auto it = slots_.find(task);
  if (it == slots_.end()) return;
  if (it->second.encoding != nullptr) it->second.encoding->abandoned = true;
  slots_.erase(it);
}

bool DownloadDeltas::Pays(const Slot& slot, const std::string& task) const {
  // From the slot's encoding once made, else from the last one retired.
  const Encoding* made =
      slot.encoding != nullptr && slot.encoding->encoded != nullptr ? slot.encoding.get() : nullptr;
  if (made == nullptr && !slot.timed) return true;  // the first: what an encoding costs and saves
  auto rates = rates_.find(task);
  if (rates == rates_.end() || rates->second.empty()) return true;
  // A peer waits for a whole encoding where it saves more than the encoding takes:
  // model * (1 - ratio) / rate > model / encode speed.
  const double slowest_paying = made != nullptr
                                    ? made->bytes_per_second * (1.0 - made->ratio)
                                    : slot.encode_bytes_per_second * (1.0 - slot.encoded_ratio);
  for (const auto& [peer, rate] : rates->second) {
    if (rate < slowest_paying) return true;
  }
  return false;
}

void DownloadDeltas::Retire(Slot& slot) {
  if (slot.encoding == nullptr) return;
  slot.encoding->abandoned = true;
  if (slot.encoding->encoded != nullptr) {
    slot.encode_bytes_per_second = slot.encoding->bytes_per_second;
    slot.encoded_ratio = slot.encoding->ratio;
    slot.timed = true;
  }
  slot.encoding.reset();
}

DownloadDeltas::Job DownloadDeltas::Start(Slot& slot, const ModelSnapshot& model,
                                          const ModelSnapshot& base) {
  Retire(slot);
  if (stopped_) return {};
  // The old encoding's memory goes once no download streams it any more.
  slot.encoding =
      std::make_shared<Encoding>(model.version, base.version, Blocks(model.model->layout));
  // A pass over both models, on the encoder; it holds them (not this object) while it runs.
  return {slot.encoding, [shared = shared_, encoding = slot.encoding, model, base] {
            std::vector<Waiter> waiters;
            absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> encoded =
                absl::CancelledError("abandoned before it started");
            if (!encoding->abandoned) {
              const absl::Time start = absl::Now();
              {
                absl::MutexLock lock(&shared->mu);
                encoding->started = start;
              }
              encoded = tensor::EncodeXorDelta(
                  model.model, *base.model,
                  [&encoding] {
                    encoding->blocks_done.fetch_add(1, std::memory_order_relaxed);
                    return !encoding->abandoned;
                  },
                  shared->encode_threads);
              const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
              const double raw_bytes = static_cast<double>(model.model->layout.total_bytes());
              {
                absl::MutexLock lock(&shared->mu);
                if (encoded.ok() && !encoding->abandoned && raw_bytes > 0) {
                  encoding->encoded = *encoded;
                  encoding->bytes_per_second = raw_bytes / std::max(seconds, 1e-6);
                  encoding->ratio = static_cast<double>((*encoded)->payload_bytes()) / raw_bytes;
                }
              }
              if (encoded.ok() && shared->on_encoded) shared->on_encoded(seconds);
            }
            {
              absl::MutexLock lock(&shared->mu);
              encoding->finished = true;
              waiters.swap(encoding->waiters);
            }
            for (Waiter& waiter : waiters) waiter(encoding->encoded);
          }};
}

void DownloadDeltas::Submit(Job job) {
  if (job.run == nullptr || encoder_.TrySubmit(job.run)) return;
  // Refused (the encoder is full or shut down): the encoding is never made, what waits for it goes
  // raw (here), and so does its version; the next version's gets its own try.
  job.encoding->abandoned = true;
  job.run();
}

}  // namespace shoal::aggregator
