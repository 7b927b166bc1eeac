// BufferPool: buffers given back are taken again with their storage, at most max_kept of them;
// a shared model's values come back when its last reference goes, and a model that outlives its
// pool frees them.

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "libs/tensor/buffer_pool.h"

namespace shoal::tensor {
namespace {

TEST(BufferPoolTest, KeepsUpToMaxKeptBuffersWithTheirStorage) {
  std::shared_ptr<BufferPool> pool = BufferPool::Create(2);
  EXPECT_TRUE(pool->Take().empty());
  std::vector<float> a(1000, 1.0f);
  const float* storage = a.data();
  pool->Give(std::move(a));
  pool->Give(std::vector<float>(10));
  pool->Give(std::vector<float>(20));  // beyond max_kept: freed
  pool->Give({});                      // no storage: not kept
  EXPECT_EQ(pool->kept(), 2u);
  EXPECT_EQ(pool->Take().size(), 10u);
  std::vector<float> again = pool->Take();
  EXPECT_EQ(again.data(), storage);
  EXPECT_EQ(pool->kept(), 0u);
}

TEST(BufferPoolTest, ASharedModelGivesItsValuesBackWhenTheLastReferenceGoes) {
  std::shared_ptr<BufferPool> pool = BufferPool::Create(4);
  FlatModel model;
  model.values.assign(500, 2.0f);
  const float* storage = model.values.data();
  std::shared_ptr<const FlatModel> shared = pool->Share(std::move(model));
  EXPECT_EQ(shared->values.data(), storage);
  std::shared_ptr<const FlatModel> second = shared;
  shared.reset();
  EXPECT_EQ(pool->kept(), 0u);
  second.reset();
  ASSERT_EQ(pool->kept(), 1u);
  EXPECT_EQ(pool->Take().data(), storage);

  // A model that outlives its pool frees its values (ASan/LSan builds check the rest).
  std::shared_ptr<const FlatModel> orphan = pool->Share(FlatModel{{}, std::vector<float>(8)});
  pool.reset();
  orphan.reset();
}

}  // namespace
}  // namespace shoal::tensor
