// The peer's snapshot store: one snapshot per kind.

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/tensor/flat_model.h"
#include "services/peer_agent/snapshot_store.h"

namespace shoal::peer {
namespace {

tensor::ModelLayout Layout(std::vector<int64_t> shape_a = {3, 4},
                           std::vector<int64_t> shape_b = {5}) {
  absl::StatusOr<tensor::ModelLayout> layout =
      tensor::ModelLayout::Create({{"a.weight", shape_a}, {"a.bias", shape_b}});
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

std::shared_ptr<const tensor::FlatModel> RandomModel(const tensor::ModelLayout& layout,
                                                     uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto m = std::make_shared<tensor::FlatModel>();
  m->layout = layout;
  m->values.resize(layout.total_elements());
  for (float& v : m->values) v = dist(gen);
  return m;
}

TEST(SnapshotStoreTest, OneSnapshotPerKind) {
  const tensor::ModelLayout layout = Layout();
  SnapshotStore store;
  EXPECT_FALSE(store.Get(peer::v1::SNAPSHOT_KIND_LATEST));
  EXPECT_FALSE(store.Latest());

  Snapshot latest{"t", 7, RandomModel(layout, 1)};
  store.Publish(latest);
  Snapshot update;
  update.task = "t";
  update.model = RandomModel(layout, 2);
  update.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
  update.round = 3;
  update.num_samples = 640;
  store.Publish(update);
  Snapshot global = update;
  global.kind = peer::v1::SNAPSHOT_KIND_GLOBAL;
  global.round = 2;
  global.model = RandomModel(layout, 3);
  store.Publish(global);

  ASSERT_TRUE(store.Latest());
  EXPECT_EQ(store.Latest()->version, 7u);
  EXPECT_EQ(store.Latest()->model, latest.model);
  auto got_update = store.Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(got_update);
  EXPECT_EQ(got_update->round, 3u);
  EXPECT_EQ(got_update->num_samples, 640u);
  EXPECT_EQ(got_update->model, update.model);
  auto got_global = store.Get(peer::v1::SNAPSHOT_KIND_GLOBAL);
  ASSERT_TRUE(got_global);
  EXPECT_EQ(got_global->round, 2u);

  // Publishing replaces only its own kind.
  update.round = 4;
  store.Publish(update);
  EXPECT_EQ(store.Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE)->round, 4u);
  EXPECT_EQ(store.Get(peer::v1::SNAPSHOT_KIND_GLOBAL)->round, 2u);

  store.Clear(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  EXPECT_FALSE(store.Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE));
  EXPECT_TRUE(store.Get(peer::v1::SNAPSHOT_KIND_GLOBAL));
  store.Clear();
  EXPECT_FALSE(store.Get(peer::v1::SNAPSHOT_KIND_GLOBAL));
  EXPECT_FALSE(store.Latest());

  // An unknown kind is ignored.
  Snapshot bad = latest;
  bad.kind = static_cast<peer::v1::SnapshotKind>(42);
  store.Publish(bad);
  EXPECT_FALSE(store.Get(static_cast<peer::v1::SnapshotKind>(42)));
}

}  // namespace
}  // namespace shoal::peer
