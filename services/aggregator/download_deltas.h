#pragma once

// Model downloads against the version a peer holds (GetModelRequest.base_version): each round's
// peers hold the same version and fetch the same new one, so the XOR_SPARSE_ZLIB encoding is made
// once per (task, version, base), as soon as the version is published, and kept for the round's
// peers. A download waits for it only where that is faster than the model raw.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/executor.h"
#include "libs/tensor/compression.h"
#include "services/aggregator/core_types.h"
#include "shoal/common/v1/model.pb.h"

namespace shoal::aggregator {

// Keeps the latest encoding per task, for at most `max_tasks` tasks (the least recently
// downloaded goes first), and makes each on `encoder` (one encoding at a time is enough: one per
// published version). A download whose encoding is not ready waits for it only where that pays:
// when the encoding's estimated remaining time is less than what it saves on this peer's link
// (its last download's rate, the task's last encoding's ratio); otherwise, and for a peer not
// measured yet, it goes raw at once. Once the task's first encoding has been made and timed, its
// next versions are encoded only while one of its peers' links is slow enough that waiting for a
// whole encoding would pay: over fast links they go raw and the encoder's CPU is spared. An
// encoding holds the deflated tensors (a fraction of the model) and the new version's model
// (which the core holds anyway while it is among the latest two); while it is being made, both
// versions. An encoding superseded by a newer version's, or whose task is pushed out, is
// abandoned: its work stops at the next 32 KiB block, the downloads waiting for it go raw, and it
// is never served. Thread-safe; the encoder's work holds no reference to this object, so it may
// be destroyed (abandoning what is under way) before the encoder is joined.
class DownloadDeltas {
 public:
  // `on_encoded(seconds)` (optional) runs on the encoder after each encoding made, with its time
  // (metrics); it must outlive the encoder's work. An encoding deflates its segments on up to
  // `encode_threads` threads: the encoder's and others started for it (tensor::EncodeXorDelta).
  DownloadDeltas(Executor& encoder, size_t max_tasks = 2,
                 std::function<void(double)> on_encoded = nullptr, int encode_threads = 1);
  ~DownloadDeltas();
  DownloadDeltas(const DownloadDeltas&) = delete;
  DownloadDeltas& operator=(const DownloadDeltas&) = delete;

  // An encoding's speed assumed before the task's first one is timed: what the 100 MB model's
  // took on the loaded 2-core machine (docs/performance.md).
  static constexpr double kFirstEncodeBytesPerSecond = 20e6;
  // The share of the model an encoding is assumed to take before the task's first is made.
  static constexpr double kFirstEncodedRatio = 0.75;

  // What a download of a model sends: the payload and the ModelMeta that goes first.
  using Send = std::function<void(std::shared_ptr<const tensor::EncodedModel> payload,
                                  const common::v1::ModelMeta& meta)>;
  // Answers a download of `model` of `task` by `peer` through `send`, exactly once: against
  // `base` (the version the peer holds, when the core still has it) when that encoding is ready,
  // or (from the encoder) once it is, where waiting for it pays; raw at once otherwise: no base,
  // the peer holds `model` itself, the encoding is not ready (it is started when none is under
  // way for this version or a newer one) or could not be made (layouts differ, the encoder was
  // full). A download waiting for an encoding that is abandoned goes raw.
  void Serve(const std::string& task, const std::string& peer, const ModelSnapshot& model,
             const absl::StatusOr<ModelSnapshot>& base, Send send);
  // A download of `task` by `peer` sent `bytes` in `seconds` (from its first byte): the peer's
  // link, as the next wait is decided on.
  void Downloaded(const std::string& task, const std::string& peer, uint64_t bytes,
                  absl::Duration seconds);
  // `peer` measured its last download of `task` at `bytes_per_second` where it arrived
  // (GetModelRequest.download_bytes_per_second): replaces what Downloaded measured, since the
  // sender's measure counts what socket buffers took as sent. Ignored unless positive and finite.
  void Reported(const std::string& task, const std::string& peer, double bytes_per_second);
  // `task`'s peers are now `members` (AggregatorService.SetMembers): the links of the peers that
  // left are forgotten, so a slow peer that left no longer keeps the task's versions encoded.
  void KeepPeers(const std::string& task, const std::set<std::string>& members);

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
  // What a download waiting for an encoding does with it (null: it could not be made).
  using Waiter = std::function<void(std::shared_ptr<const tensor::EncodedModel>)>;
  // One encoding of `version` against `base_version`, made on the encoder.
  struct Encoding {
    Encoding(uint64_t version, uint64_t base_version, uint64_t blocks)
        : version(version), base_version(base_version), blocks(blocks) {}
    const uint64_t version;
    const uint64_t base_version;
    const uint64_t blocks;  // of kXorBlockValues values, over all tensors
    std::atomic<bool> abandoned{false};
    std::atomic<uint64_t> blocks_done{0};
    // The rest under Shared::mu. `encoded` is set once, by the encoder; null until then, and for
    // good when the encoding could not be made (layouts differ, abandoned, the encoder refused).
    absl::Time started = absl::InfiniteFuture();
    bool finished = false;
    std::shared_ptr<const tensor::EncodedModel> encoded;
    double bytes_per_second = 0;  // once made: its speed and its share of the model
    double ratio = 0;
    std::vector<Waiter> waiters;
  };
  struct Slot {
    std::shared_ptr<Encoding> encoding;
    uint64_t last_used = 0;
    // From the task's last encoding made (kFirst... before it, `timed` false).
    double encode_bytes_per_second = kFirstEncodeBytesPerSecond;
    double encoded_ratio = kFirstEncodedRatio;
    bool timed = false;
  };
  // An encoding started, and the work that makes it (on the encoder).
  struct Job {
    std::shared_ptr<Encoding> encoding;
    std::function<void()> run;
  };
  // What the encoder's work shares with this object.
  struct Shared {
    Shared(std::function<void(double)> on_encoded, int encode_threads)
        : on_encoded(std::move(on_encoded)), encode_threads(encode_threads) {}
    const std::function<void(double)> on_encoded;
    const int encode_threads;
    absl::Mutex mu;
  };

  // The task's encoding of `model` against `base` when it is ready; null otherwise, with `job`
  // set when one should be started (Submit) and `waiter` queued when `peer` waits for it. Counts
  // the use; pushes out the least recently used task beyond max_tasks_.
  std::shared_ptr<const tensor::EncodedModel> Find(const std::string& task, const std::string& peer,
                                                   const ModelSnapshot& model,
                                                   const ModelSnapshot& base, Job& job,
                                                   Waiter& waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Whether `peer`'s download of `model` waits for `encoding`, not ready yet.
  bool Waits(const Slot& slot, const Encoding& encoding, const std::string& task,
             const std::string& peer, const ModelSnapshot& model) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Whether `task`'s next version is worth encoding: until one of its encodings has been made
  // and timed, yes; then only while one of its peers is slow enough that waiting for a whole
  // encoding would pay (or none has been measured). Over fast links the versions go raw and
  // the encoder's CPU is spared.
  bool Pays(const Slot& slot, const std::string& task) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Abandons the slot's encoding, keeping its speed and ratio when it was made.
  void Retire(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Puts a new encoding of `model` against `base` in `slot`, abandoning what it held; returns
  // the work that makes it.
  Job Start(Slot& slot, const ModelSnapshot& model, const ModelSnapshot& base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_->mu);
  // Queues `job` (when there is one) on the encoder.
  void Submit(Job job);
  // Records `peer`'s link rate for `task` (none for an empty peer: the coordinator's downloads).
  void SetRate(const std::string& task, const std::string& peer, double bytes_per_second);

  Executor& encoder_;
  const size_t max_tasks_;
  const std::shared_ptr<Shared> shared_;
  std::map<std::string, Slot> slots_ ABSL_GUARDED_BY(shared_->mu);
  // Per task, per peer: its link's bytes per second, from its last download (the peer's report
  // where it gave one, else what this side measured).
  std::map<std::string, std::map<std::string, double>> rates_ ABSL_GUARDED_BY(shared_->mu);
  uint64_t uses_ ABSL_GUARDED_BY(shared_->mu) = 0;
  bool stopped_ ABSL_GUARDED_BY(shared_->mu) = false;
};

}  // namespace shoal::aggregator
