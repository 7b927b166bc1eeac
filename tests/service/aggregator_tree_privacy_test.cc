// Peer-level differential privacy on a tree over real gRPC: three in-process shoal-aggregator
// servers on 127.0.0.1:0, a root and two cluster aggregators (leaves). The leaves add their
// peers' clipped updates, each weighing 1, into partial sums; only the root adds noise, and it
// divides by the peers expected in the whole round (dp_round_peers). With distributed noise the
// root draws the shares of every expected peer whose update no sum carries, wherever in the tree
// it went missing; a leaf may be a secure round whose peers add their shares before masking.

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/dp_update.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/aggregator/secure_participant.h"
#include "tests/service/aggregator_service_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

common::v1::DpSpec Dp(common::v1::DpNoise noise, double clip, double sigma) {
  common::v1::DpSpec dp;
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(noise);
  dp.set_clip_norm(clip);
  dp.set_noise_multiplier(sigma);
  dp.set_delta(1e-5);
  return dp;
}

// Update k: values of a few sizes, so that a mistake in the weights shows.
tensor::FlatModel Delta(int k) {
  return Filled([k](size_t i) {
    return std::pow(10.0f, static_cast<float>(k % 3) - 2.0f) *
           std::sin(0.001f * static_cast<float>(i) + 1.3f * static_cast<float>(k));
  });
}

// The root mean square of `values` (their spread around 0).
double Rms(const std::vector<double>& values) {
  double sq = 0;
  for (double v : values) sq += v * v;
  return std::sqrt(sq / static_cast<double>(values.size()));
}

class AggregatorTreePrivacyTest : public AggregatorServiceFixture {
 protected:
  void SetUp() override {
    AggregatorServiceFixture::SetUp();
    for (auto* leaf : {&leaf_a_, &leaf_b_}) {
      AggregatorOptions options;
      options.tls.insecure = true;
      options.listen = "127.0.0.1:0";
      options.metrics_listen = "127.0.0.1:0";
      options.coordinator = registry_server_->address();
      options.shutdown_grace = absl::Milliseconds(100);
      auto server = AggregatorServer::Start(options);
      ASSERT_TRUE(server.ok()) << server.status();
      *leaf = *std::move(server);
    }
    root_ = server_->address();
    a_ = leaf_a_->address();
    b_ = leaf_b_->address();
  }
  void TearDown() override {
    for (auto* leaf : {&leaf_a_, &leaf_b_}) {
      if (*leaf) (*leaf)->Shutdown();
    }
    AggregatorServiceFixture::TearDown();
  }

  static absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

  void PutBase(const tensor::FlatModel& base) {
    base_ = std::make_shared<const tensor::FlatModel>(base);
    for (const std::string& at : {root_, a_, b_}) {
      auto put = client_.PutModel(at, tensor::MakeModelMeta("t", 0, *base_),
                                  tensor::EncodeRaw(base_), {}, Deadline());
      ASSERT_TRUE(put.ok()) << put.status();
    }
  }

  static v1::OpenRoundRequest Round(std::vector<std::string> peers, common::v1::DpSpec dp,
                                    uint32_t round_peers) {
    v1::OpenRoundRequest request;
    request.set_task("t");
    request.set_round(1);
    request.set_base_version(0);
    for (const std::string& p : peers) request.add_expected_peers(p);
    request.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEAN);
    *request.mutable_dp() = std::move(dp);
    request.set_dp_round_peers(round_peers);
    return request;
  }

  // The tree the coordinator opens for 8 peers: root p6, leaf a p0..p2, leaf b p3, p4, p5, p7.
  void OpenTree(const common::v1::DpSpec& dp) {
    v1::OpenRoundRequest root = Round({"p6"}, dp, 8);
    root.add_expected_children("leaf-a");
    root.add_expected_children("leaf-b");
    ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
    v1::OpenRoundRequest a = Round({"p0", "p1", "p2"}, dp, 8);
    a.mutable_parent()->set_address(root_);
    a.mutable_parent()->set_child("leaf-a");
    ASSERT_TRUE(client_.OpenRound(a_, a, Deadline()).ok());
    v1::OpenRoundRequest b = Round({"p3", "p4", "p5", "p7"}, dp, 8);
    b.mutable_parent()->set_address(root_);
    b.mutable_parent()->set_child("leaf-b");
    ASSERT_TRUE(client_.OpenRound(b_, b, Deadline()).ok());
  }

  absl::Status PushTo(const std::string& at, int k, const tensor::FlatModel& delta) {
    auto shared = std::make_shared<const tensor::FlatModel>(delta);
    // Sample counts that differ a lot: DP weighs each update 1 whatever it says.
    v1::UpdateMeta meta = Meta(absl::StrCat("p", k), 1 + 50 * k, "t");
    return client_.PushUpdate(at, meta, tensor::EncodeRaw(shared), Deadline()).status();
  }

  absl::StatusOr<v1::CloseRoundResponse> CloseAt(const std::string& at) {
    v1::CloseRoundRequest request;
    request.set_task("t");
    request.set_round(1);
    return client_.CloseRound(at, request, Deadline());
  }

  // The published version 1's delta from the base.
  std::vector<double> PublishedDelta() {
    auto published = Get("t", 1);
    EXPECT_TRUE(published.ok()) << published.status();
    std::vector<double> delta(base_->values.size(), 0.0);
    for (size_t i = 0; published.ok() && i < delta.size(); ++i) {
      delta[i] = static_cast<double>(published->model.values[i]) - base_->values[i];
    }
    return delta;
  }

  std::shared_ptr<const tensor::FlatModel> base_;
  GrpcAggregatorClient client_;
  std::unique_ptr<AggregatorServer> leaf_a_, leaf_b_;
  std::string root_, a_, b_;
};

TEST_F(AggregatorTreePrivacyTest, TheRootDividesTheTreesSumByTheRoundsExpectedPeers) {
  PutBase(Filled([](size_t i) { return 0.001f * static_cast<float>(i % 1000); }));
  // Distributed noise at sigma 0: nobody adds noise, so the weights and the divisor show
  // exactly. Clip far above the updates' norms (the peers clipped).
  OpenTree(Dp(common::v1::DP_NOISE_DISTRIBUTED, 1e6, 0.0));
  for (int k : {0, 1, 2}) ASSERT_TRUE(PushTo(a_, k, Delta(k)).ok());
  for (int k : {3, 4, 5}) ASSERT_TRUE(PushTo(b_, k, Delta(k)).ok());  // p7 never pushes
  ASSERT_TRUE(PushTo(root_, 6, Delta(6)).ok());
  for (const std::string& leaf : {a_, b_}) {
    auto closed = CloseAt(leaf);
    ASSERT_TRUE(closed.ok()) << closed.status();
    EXPECT_TRUE(closed->forwarded());
  }
  auto root = CloseAt(root_);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->version(), 1u);
  EXPECT_THAT(root->contributors(), ElementsAre("p0", "p1", "p2", "p3", "p4", "p5", "p6"));
  std::vector<tensor::FlatModel> deltas;
  for (int k = 0; k < 7; ++k) deltas.push_back(Delta(k));
  const std::vector<double> published = PublishedDelta();
  for (size_t i = 0; i < published.size(); i += 7) {
    double sum = 0;
    for (const tensor::FlatModel& d : deltas) sum += d.values[i];
    // Over the 8 peers of the whole round: not the 7 that pushed, nor a leaf's own 3 or 4.
    ASSERT_NEAR(published[i], sum / 8, 2e-6) << i;
  }
}

TEST_F(AggregatorTreePrivacyTest, CentralNoiseIsAddedOnceAtTheRoot) {
  PutBase(Filled([](size_t) { return 0.0f; }));
  const double sigma = 0.8;
  const double clip = 2.5;
  OpenTree(Dp(common::v1::DP_NOISE_CENTRAL, clip, sigma));
  const tensor::FlatModel zero = Filled([](size_t) { return 0.0f; });
  for (int k : {0, 1, 2}) ASSERT_TRUE(PushTo(a_, k, zero).ok());
  for (int k : {3, 4, 5}) ASSERT_TRUE(PushTo(b_, k, zero).ok());
  ASSERT_TRUE(PushTo(root_, 6, zero).ok());
  for (const std::string& leaf : {a_, b_}) ASSERT_TRUE(CloseAt(leaf).ok());
  ASSERT_TRUE(CloseAt(root_).ok());
  // All noise: N(0, (sigma C)^2) once, over 8: sd 0.25. Had each leaf added it too, sd would be
  // sqrt(3) x 0.25 = 0.43; the 321 000 values give a standard error of 0.0003.
  const double rms = Rms(PublishedDelta());
  std::printf("[ figure ] central: published sd %.5f, want %.5f\n", rms, sigma * clip / 8);
  EXPECT_NEAR(rms, sigma * clip / 8, 0.005);
}

TEST_F(AggregatorTreePrivacyTest, TheRootMakesUpTheSharesOfPeersMissingAnywhereInTheTree) {
  PutBase(Filled([](size_t) { return 0.0f; }));
  const double sigma = 2.0;
  const double clip = 1.0;
  OpenTree(Dp(common::v1::DP_NOISE_DISTRIBUTED, clip, sigma));
  // Each update is zero, as if its own share cancelled: the sum is what the root adds.
  const tensor::FlatModel zero = Filled([](size_t) { return 0.0f; });
  for (int k : {0, 1, 2}) ASSERT_TRUE(PushTo(a_, k, zero).ok());
  // Leaf b has p3's update, but its partial sum never reaches the root (p4, p5, p7 never push).
  ASSERT_TRUE(PushTo(b_, 3, zero).ok());
  ASSERT_TRUE(PushTo(root_, 6, zero).ok());
  ASSERT_TRUE(CloseAt(a_).ok());
  auto root = CloseAt(root_);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_THAT(root->contributors(), ElementsAre("p0", "p1", "p2", "p6"));
  // 4 of 8 shares missing: N(0, (sigma C)^2 x 4 / 8), over 8: sd 2 x 0.707 / 8 = 0.177.
  const double rms = Rms(PublishedDelta());
  std::printf("[ figure ] distributed, 4 of 8 missing: published sd %.5f, want %.5f\n", rms,
              sigma * clip * std::sqrt(0.5) / 8);
  EXPECT_NEAR(rms, sigma * clip * std::sqrt(0.5) / 8, 0.004);
}

TEST_F(AggregatorTreePrivacyTest, WhatATreeRoundWithDpCannotTakeIsRefused) {
  PutBase(Filled([](size_t) { return 0.0f; }));
  const common::v1::DpSpec dp = Dp(common::v1::DP_NOISE_CENTRAL, 1, 1);
  v1::OpenRoundRequest root = Round({}, dp, 0);
  root.add_expected_children("leaf-a");
  absl::Status refused = client_.OpenRound(root_, root, Deadline());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("a tree's round needs dp_round_peers"));
  v1::OpenRoundRequest replicated = Round({"p0"}, dp, 2);
  replicated.add_expected_children("leaf-a");
  replicated.add_backups("127.0.0.1:1");
  refused = client_.OpenRound(root_, replicated, Deadline());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("no late peers or replicas"));
  // A leaf without DP weighs updates by their samples: the DP root refuses its sum.
  root.set_dp_round_peers(2);
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  v1::OpenRoundRequest a = Round({"p0", "p1"}, {}, 0);
  a.mutable_parent()->set_address(root_);
  a.mutable_parent()->set_child("leaf-a");
  ASSERT_TRUE(client_.OpenRound(a_, a, Deadline()).ok());
  for (int k : {0, 1}) ASSERT_TRUE(PushTo(a_, k, Delta(k)).ok());
  auto closed = CloseAt(a_);
  ASSERT_FALSE(closed.ok());
  EXPECT_THAT(closed.status().message(), HasSubstr("differential privacy weighs every update 1"));
}

// A secure cluster: leaf a runs a secure round of 3 peers, each adding its share of distributed
// noise (sized for the whole round's 5 peers) before masking; its survivors' sum goes up in a
// plain round. Leaf b's two peers never make it: the root adds their shares.
TEST_F(AggregatorTreePrivacyTest, ASecureClustersPeersAddTheirSharesAndTheRootTheMissingOnes) {
  constexpr size_t kValues = 20000;
  const auto layout = *tensor::ModelLayout::Create({{"w", {kValues}}});
  PutBase(Filled([](size_t) { return 0.0f; }, layout));
  const double sigma = 2.0;
  const common::v1::DpSpec dp = Dp(common::v1::DP_NOISE_DISTRIBUTED, 1.0, sigma);
  const double share = privacy::DistributedNoiseStddev(sigma, 1.0, 5);
  v1::OpenRoundRequest root = Round({}, dp, 5);
  root.add_expected_children("leaf-a");
  root.add_expected_children("leaf-b");
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  struct Peer {
    std::string id;
    std::shared_ptr<const privacy::secagg::KeySigner> signer;
    std::vector<float> update;
  };
  std::vector<Peer> peers;
  std::map<std::string, std::string> keys;
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.f, static_cast<float>(share));
  v1::OpenRoundRequest a = Round({}, dp, 5);
  a.mutable_parent()->set_address(root_);
  a.mutable_parent()->set_child("leaf-a");
  a.mutable_secure_aggregation()->set_enabled(true);
  a.mutable_secure_aggregation()->set_clip_norm(1.0);
  a.mutable_secure_aggregation()->set_step_timeout_ms(20000);
  for (int i = 0; i < 3; ++i) {
    auto identity = privacy::GenerateEd25519KeyPair();
    ASSERT_TRUE(identity.ok()) << identity.status();
    auto signer = privacy::secagg::Ed25519KeySigner::Create(identity->private_key);
    ASSERT_TRUE(signer.ok()) << signer.status();
    Peer peer{absl::StrCat("s", i), *std::move(signer), std::vector<float>(kValues)};
    for (float& v : peer.update) v = noise(rng);  // a zero update and its share of the noise
    keys[peer.id] = identity->public_key;
    a.add_expected_peers(peer.id);
    (*a.mutable_secure_aggregation()->mutable_identity_keys())[peer.id] = identity->public_key;
    peers.push_back(std::move(peer));
  }
  ASSERT_TRUE(client_.OpenRound(a_, a, Deadline()).ok());
  std::vector<absl::Status> results(peers.size());
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < peers.size(); ++i) {
      threads.emplace_back([&, i] {
        SecureContribution c;
        c.peer_id = peers[i].id;
        c.signer = peers[i].signer;
        c.identity_keys = keys;
        c.update = peers[i].update;
        c.noise_stddev = share;
        c.num_samples = 5;
        SecureParticipant party(std::move(c));
        results[i] = client_.SecureAggregate(a_, "t", 1, Caller{peers[i].id, ""}, party,
                                             absl::Now() + absl::Seconds(60));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  auto leaf = CloseAt(a_);
  ASSERT_TRUE(leaf.ok()) << leaf.status();
  EXPECT_TRUE(leaf->forwarded());
  auto closed = CloseAt(root_);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors(), ElementsAre("s0", "s1", "s2"));
  // What the root added: published x 5 - the three updates (the secure sum decodes within a
  // quantum of theirs): the two missing shares, N(0, (sigma C)^2 x 2 / 5), sd 1.26. With 20 000
  // values the standard error is 0.0063.
  const std::vector<double> published = PublishedDelta();
  std::vector<double> added(kValues);
  double total = 0;
  for (size_t i = 0; i < kValues; ++i) {
    double sum = 0;
    for (const Peer& p : peers) sum += p.update[i];
    added[i] = published[i] * 5 - sum;
    total += published[i] * 5;
  }
  std::printf("[ figure ] secure cluster, 2 of 5 missing: root's noise sd %.4f, want %.4f\n",
              Rms(added), sigma * std::sqrt(2.0 / 5));
  EXPECT_NEAR(Rms(added), sigma * std::sqrt(2.0 / 5), 0.04);
  // And the whole sum carries all of the noise: sd sigma x C.
  EXPECT_NEAR(Rms(published) * 5, sigma, 0.06);
  EXPECT_NEAR(total / kValues, 0.0, 0.06);
}

}  // namespace
}  // namespace shoal::aggregator
