#include "libs/tensor/buffer_pool.h"

#include <utility>

namespace shoal::tensor {

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_kept) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_kept));
}

std::vector<float> BufferPool::Take() {
  absl::MutexLock lock(&mu_);
  if (kept_.empty()) return {};
  std::vector<float> buffer = std::move(kept_.back());
  kept_.pop_back();
  return buffer;
}

void BufferPool::Give(std::vector<float> buffer) {
  if (buffer.capacity() == 0) return;
  absl::MutexLock lock(&mu_);
  if (kept_.size() < max_kept_) kept_.push_back(std::move(buffer));
}

std::shared_ptr<const FlatModel> BufferPool::Share(FlatModel model) {
  return std::shared_ptr<FlatModel>(new FlatModel(std::move(model)),
                                    [pool = weak_from_this()](FlatModel* shared) {
                                      if (std::shared_ptr<BufferPool> p = pool.lock()) {
                                        p->Give(std::move(shared->values));
                                      }
                                      delete shared;
                                    });
}

size_t BufferPool::kept() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

}  // namespace shoal::tensor
