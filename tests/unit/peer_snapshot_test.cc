// The peer's snapshot store: one snapshot per kind (and the round before's GLOBAL).

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

// A decentralized peer publishes round N's average as soon as it has it, before the coordinator
// completes round N (or when the round's attempt fails and joins open again): joiners sent to
// it for round N - 1 still get that round until the coordinator has completed round N.
TEST(SnapshotStoreTest, TheGlobalOfTheRoundBeforeIsServedUntilTheNextIsComplete) {
  const tensor::ModelLayout layout = Layout();
  SnapshotStore store;
  auto publish = [&](uint64_t round) {
    Snapshot global;
    global.task = "t";
    global.model = RandomModel(layout, static_cast<uint32_t>(round));
    global.kind = peer::v1::SNAPSHOT_KIND_GLOBAL;
    global.round = round;
    store.Publish(std::move(global));
  };
  auto serve = [&](uint64_t round) {
    peer::v1::GetSnapshotRequest request;
    request.set_task("t");
    request.set_kind(peer::v1::SNAPSHOT_KIND_GLOBAL);
    request.set_round(round);
    return store.Serve(request);
  };
  publish(4);
  publish(5);
  ASSERT_TRUE(serve(4).ok()) << serve(4).status();
  EXPECT_EQ(serve(4)->meta.version(), 4u);
  EXPECT_EQ(serve(5)->meta.version(), 5u);
  EXPECT_EQ(serve(3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Get(peer::v1::SNAPSHOT_KIND_GLOBAL)->round, 5u);

  store.DropGlobalsBefore(5);  // round 5 is complete
  EXPECT_EQ(serve(4).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(serve(5).ok());

  // Back to an earlier round (a peer that left a round it had averaged): only that one.
  publish(6);
  publish(5);
  EXPECT_EQ(serve(6).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(serve(5).ok());
  publish(6);
  store.Clear(peer::v1::SNAPSHOT_KIND_GLOBAL);
  EXPECT_EQ(serve(5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(serve(6).status().code(), absl::StatusCode::kNotFound);
}

// A snapshot served raw many times (a round's update, to every other participant) is hashed by
// its first serve only; a new publish is hashed again.
TEST(SnapshotStoreTest, AModelServedRawIsHashedOnce) {
  const tensor::ModelLayout layout = Layout();
  SnapshotStore store;
  auto model = std::const_pointer_cast<tensor::FlatModel>(RandomModel(layout, 7));
  Snapshot update;
  update.task = "t";
  update.model = model;
  update.kind = peer::v1::SNAPSHOT_KIND_ROUND_UPDATE;
  update.round = 2;
  store.Publish(update);
  peer::v1::GetSnapshotRequest request;
  request.set_task("t");
  request.set_kind(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  request.set_round(2);
  absl::StatusOr<SnapshotStore::Served> first = store.Serve(request);
  ASSERT_TRUE(first.ok()) << first.status();
  tensor::TensorDigests fresh;
  const std::vector<uint64_t> want = fresh.Of(*model);
  EXPECT_EQ(first->model->digests, want);
  EXPECT_EQ(first->model->payloads[0].data(), reinterpret_cast<const char*>(model->values.data()));

  // The digests are kept: a serve after the model changed (which a publisher never does) still
  // carries the first ones.
  model->values[0] += 1.0f;
  absl::StatusOr<SnapshotStore::Served> second = store.Serve(request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->model->digests, want);
  store.Publish(update);
  absl::StatusOr<SnapshotStore::Served> third = store.Serve(request);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_NE(third->model->digests, want);
  tensor::TensorDigests now;
  EXPECT_EQ(third->model->digests, now.Of(*model));
}

}  // namespace
}  // namespace shoal::peer
