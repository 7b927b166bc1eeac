#pragma once

// Model downloads against the version a peer holds (GetModelRequest.base_version): each round's
// peers hold the same version and fetch the same new one, so the XOR_ZLIB encoding is made once
// per (task, version, base) and kept for the next peers.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/common/executor.h"
#include "libs/tensor/compression.h"
#include "services/aggregator/core_types.h"
#include "shoal/common/v1/model.pb.h"

namespace shoal::aggregator {

// Keeps the latest encoding per task, for at most `max_tasks` tasks (the least recently asked
// for goes first). An encoding holds the deflated tensors (a fraction of the model) and the new
// version's model (which the core holds anyway while it is among the latest two). A second peer
// asking for an encoding being made waits for it rather than make it again. Thread-safe.
class DownloadDeltas {
 public:
  // `on_encoded(seconds)` (optional) runs after each encoding made, with its time (metrics).
  explicit DownloadDeltas(size_t max_tasks = 2, std::function<void(double)> on_encoded = nullptr)
      : max_tasks_(max_tasks), on_encoded_(std::move(on_encoded)) {}

  // What a download of `model` sends: the payload and the ModelMeta that goes first.
  using Send = std::function<void(std::shared_ptr<const tensor::EncodedModel> payload,
                                  const common::v1::ModelMeta& meta)>;
  // Answers one download of `model` of `task` through `send`, exactly once, from any thread:
  // against `base` (the version the peer holds, when the core still has it) encoded on
  // `executor`; raw when there is no base, the executor is full or the layouts differ.
  void Serve(const std::string& task, const ModelSnapshot& model,
             const absl::StatusOr<ModelSnapshot>& base, Executor& executor, Send send);

  // `model` of `task` encoded against `base` (tensor::EncodeXorDelta). INVALID_ARGUMENT when
  // their layouts differ.
  absl::StatusOr<std::shared_ptr<const tensor::EncodedModel>> Get(const std::string& task,
                                                                  const ModelSnapshot& model,
                                                                  const ModelSnapshot& base);

 private:
  struct Entry {
    absl::Mutex mu;  // held while the encoding is made
    uint64_t version ABSL_GUARDED_BY(mu) = 0;
    uint64_t base_version ABSL_GUARDED_BY(mu) = 0;
    std::shared_ptr<const tensor::EncodedModel> encoded ABSL_GUARDED_BY(mu);
  };
  struct Slot {
    std::shared_ptr<Entry> entry;
    uint64_t last_used = 0;
  };

  const size_t max_tasks_;
  const std::function<void(double)> on_encoded_;
  absl::Mutex mu_;
  std::map<std::string, Slot> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::aggregator
