#pragma once

// Model-sized float buffers kept for reuse. A process allocates a model-sized buffer fresh from
// the system (rpc::TuneAllocatorForModelStreams maps anything over 16 MiB on its own) and the
// kernel faults in and zeroes every page of it on first touch, again for each buffer: about
// 45 ms per 100 MB on the project's 2-core machine. Decoding or summing into a buffer used
// before touches no fresh memory.

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "libs/tensor/flat_model.h"

namespace shoal::tensor {

// Thread-safe. Held by shared_ptr so that models shared with Share can outlive it.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_kept` buffers; a buffer given back beyond that is freed.
  static std::shared_ptr<BufferPool> Create(size_t max_kept);

  // A kept buffer (its contents are left over: callers overwrite them, e.g.
  // FrameDecoder::ForLayout), or an empty one when none is kept.
  std::vector<float> Take();
  // Keeps `buffer` for a later Take (when it has storage and there is room).
  void Give(std::vector<float> buffer);
  // `model`, shared; its values come back to this pool (if it still exists) when the last
  // reference goes.
  std::shared_ptr<const FlatModel> Share(FlatModel model);

  size_t kept() const;

 private:
  explicit BufferPool(size_t max_kept) : max_kept_(max_kept) {}

  const size_t max_kept_;
  mutable absl::Mutex mu_;
  std::vector<std::vector<float>> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::tensor
