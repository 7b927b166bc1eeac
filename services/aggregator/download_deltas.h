#pragma once

// Model downloads against the version a peer holds (GetModelRequest.base_version): each round's
// peers hold the same version and fetch the same new one, so the XOR_ZLIB encoding is made once
// per (task, version, base), as soon as the version is published, and kept for the round's
// peers. A download never waits for it: until it is ready the model goes raw.

#include <atomic>
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

// Keeps the latest encoding per task, for at most `max_tasks` tasks (the least recently
// downloaded goes first), and makes each on `encoder` (one encoding at a time is enough: one per
// published version). An encoding holds the deflated tensors (a fraction of the model) and the
// new version's model (which the core holds anyway while it is among the latest two); while it
// is being made, both versions. An encoding superseded by a newer version's, or whose task is
// pushed out, is abandoned: its work stops at the next 32 KiB block and it is never served.
// Thread-safe; the encoder's work holds no reference to this object, so it may be destroyed
// (abandoning what is under way) before the encoder is joined.
class DownloadDeltas {
 public:
  // `on_encoded(seconds)` (optional) runs on the encoder after each encoding made, with its time
  // (metrics); it must outlive the encoder's work.
  DownloadDeltas(Executor& encoder, size_t max_tasks = 2,
                 std::function<void(double)> on_encoded = nullptr);
  ~DownloadDeltas();
  DownloadDeltas(const DownloadDeltas&) = delete;
  DownloadDeltas& operator=(const DownloadDeltas&) = delete;

  // What a download of a model sends: the payload and the ModelMeta that goes first.
  struct Download {
    std::shared_ptr<const tensor::EncodedModel> payload;
    common::v1::ModelMeta meta;
  };
  // A download of `model` of `task`, at once: against `base` (the version the peer holds, when
  // the core still has it) when that encoding is ready; raw otherwise: no base, the peer holds
  // `model` itself, the encoding is not made yet (it is started when none is under way for this
  // version or a newer one) or could not be made (layouts differ, the encoder was full).
  Download Serve(const std::string& task, const ModelSnapshot& model,
                 const absl::StatusOr<ModelSnapshot>& base);

  // `model` of `task` was published after `base`: when the task's peers download against held
  // versions (one has, since the task was last pushed out), starts encoding it against `base`
  // and abandons the task's older encoding. Cheap, never blocks: the core calls it while
  // publishing.
  void Prepare(const std::string& task, const ModelSnapshot& model, const ModelSnapshot& base);
  // The task is done here: its encoding is abandoned and dropped.
  void Release(const std::string& task);
  // Abandons every encoding and starts no more (the aggregator is shutting down: its encoder is
  // joined next). The destructor does it too.
  void Stop();

 private:
  // One encoding of `version` against `base_version`, made on the encoder.
  struct Encoding {
    Encoding(uint64_t version, uint64_t base_version)
        : version(version), base_version(base_version) {}
    const uint64_t version;
    const uint64_t base_version;
    std::atomic<bool> abandoned{false};
    // Set once, by the encoder, under Shared::mu; null until then, and for good when the
    // encoding could not be made (layouts differ, abandoned, the encoder refused it).
    std::shared_ptr<const tensor::EncodedModel> encoded;
  };
  struct Slot {
    std::shared_ptr<Encoding> encoding;
    uint64_t last_used = 0;
  };
  // What the encoder's work shares with this object.
  struct Shared {
    explicit Shared(std::function<void(double)> on_encoded) : on_encoded(std::move(on_encoded)) {}
    const std::function<void(double)> on_encoded;
    absl::Mutex mu;
  };

  // The task's encoding of `model` against `base` when it is ready; null otherwise, with `job`
  // set when one should be started (Submit). Counts the use; pushes out the least recently used
  // task beyond max_tasks_.
  std::shared_ptr<const tensor::EncodedModel> Find(const std::string& task,
                                                   const ModelSnapshot& model,
                                                   const ModelSnapshot& base,
                                                   std::function<void()>& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Puts a new encoding of `model` against `base` in `slot`, abandoning what it held; returns
  // the work that makes it.
  std::function<void()> Start(Slot& slot, const ModelSnapshot& model, const ModelSnapshot& base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Queues `job` (when there is one) on the encoder.
  void Submit(std::function<void()> job);

  Executor& encoder_;
  const size_t max_tasks_;
  const std::shared_ptr<Shared> shared_;
  std::map<std::string, Slot> slots_ ABSL_GUARDED_BY(shared_->mu);
  uint64_t uses_ ABSL_GUARDED_BY(shared_->mu) = 0;
  bool stopped_ ABSL_GUARDED_BY(shared_->mu) = false;
};

}  // namespace shoal::aggregator
