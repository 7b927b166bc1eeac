// A decentralized task with compression (issue 13 §7): each participant serves its round update
// as a compressed delta against the round's base, every participant (itself too) folds the
// decoded deltas, and all of them still end each round bit-identical. Real trainers, real
// PeerServices on 127.0.0.1:0, the test playing the coordinator.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/decentralized_test_peer.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;

// Top-k 1% with int8 values: the MLP's first layer (156,800 values) is sparsified, the small
// tensors (2,210 values) travel whole as int8.
common::v1::TaskSpec CompressedSpec() {
  common::v1::TaskSpec spec = Spec();
  spec.set_compression(common::v1::COMPRESSION_TOPK);
  spec.set_topk_ratio(0.01);
  spec.set_topk_values(common::v1::COMPRESSION_INT8);
  spec.set_topk_min_elements(4096);
  return spec;
}

using DecentralizedCompressionTest = DecentralizedRunnerTest;

// Plays one whole round for `peers` (RoundOpen, PeerList, StartSharing) and returns the digest
// every one of them reported in SharingDone (failing unless they all agree).
uint64_t PlayRound(const std::vector<TestPeer*>& peers, uint64_t round) {
  std::vector<coordinator::v1::PeerEndpoint> endpoints;
  for (TestPeer* p : peers) endpoints.push_back(p->Endpoint());
  for (TestPeer* p : peers) {
    p->Handle(RoundOpen(round));
    EXPECT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
  }
  for (TestPeer* p : peers) {
    p->Handle(PeerList(round, 1, endpoints));
    p->Take();
  }
  std::vector<uint64_t> digests;
  for (TestPeer* p : peers) {
    p->Handle(StartSharing(round, 1));
    const std::vector<PeerMessage> sent = p->Take();
    const PeerMessage* done = Find(sent, PeerMessage::kSharingDone);
    EXPECT_NE(done, nullptr) << (sent.empty() ? "" : sent.back().ShortDebugString());
    if (done == nullptr) return 0;
    digests.push_back(done->sharing_done().digest_xxh3());
    EXPECT_EQ(DecentralizedRunnerProbe::Held(p->runner()).Digest(), digests.back());
  }
  for (uint64_t d : digests) EXPECT_EQ(d, digests[0]) << "round " << round;
  return digests[0];
}

// Three participants over two rounds: bit-identical models after each, the model moving, and
// each update on the wire about a hundredth of the model (the bytes a peer pulled say so).
TEST_F(DecentralizedCompressionTest, CompressedDeltasEndBitIdenticalAtAFractionOfTheBytes) {
  const common::v1::TaskSpec spec = CompressedSpec();
  TestPeer a("peer-a", 0, 3, *train_, *test_, {}, spec);
  TestPeer b("peer-b", 1, 3, *train_, *test_, {}, spec);
  TestPeer c("peer-c", 2, 3, *train_, *test_, {}, spec);
  const std::vector<TestPeer*> all = {&a, &b, &c};
  for (TestPeer* p : all) {
    p->runner().Start();
    p->Take();
  }
  const uint64_t initial = DecentralizedRunnerProbe::Held(a.runner()).Digest();
  const uint64_t raw_bytes = DecentralizedRunnerProbe::Held(a.runner()).layout.total_bytes();

  const uint64_t first = PlayRound(all, 1);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(first, initial);
  // The update served: a delta, encoded, a small fraction of the model raw.
  std::optional<Snapshot> update = b.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(update);
  ASSERT_NE(update->encoded, nullptr);
  EXPECT_LT(update->encoded->payload_bytes() * 50, raw_bytes);
  EXPECT_EQ(b.metrics().update_bytes_sent.Value(),
            static_cast<double>(update->encoded->payload_bytes()));
  EXPECT_EQ(b.metrics().update_bytes_raw.Value(), static_cast<double>(raw_bytes));
  // Its decoded values are what the others folded: top-k kept 1% of the first layer.
  size_t nonzero = 0;
  for (float v : update->model->values) nonzero += v != 0 ? 1 : 0;
  EXPECT_LE(nonzero, 1568u + 2210u);
  EXPECT_GT(nonzero, 1000u);

  // Round 2 (top-k's residual now carries what round 1 did not send): still identical.
  const uint64_t second = PlayRound(all, 2);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(second, first);
  // Each peer pulled two updates a round: far less than two models a round.
  for (TestPeer* p : all) {
    EXPECT_GT(p->metrics().peer_bytes_pulled.Value(), 0);
    EXPECT_LT(p->metrics().peer_bytes_pulled.Value() * 30, 4.0 * raw_bytes);
  }
  // The global snapshot a late joiner syncs from is the whole model, raw.
  std::optional<Snapshot> global = a.store().Get(peer::v1::SNAPSHOT_KIND_GLOBAL);
  ASSERT_TRUE(global);
  EXPECT_EQ(global->encoded, nullptr);
  EXPECT_EQ(global->model->Digest(), second);
}

// A peer that leaves a round (here: its join refused) trains that round again from the same
// model, data position and optimizer state: with top-k it must also start from the same
// residual, or the update it then serves would carry the abandoned one's leftovers twice.
TEST_F(DecentralizedCompressionTest, ALeftRoundLeavesNoTraceInTheResidual) {
  TestPeer a("peer-a", 0, 2, *train_, *test_, {}, CompressedSpec());
  a.runner().Start();
  a.Take();
  a.Handle(RoundOpen(1));
  ASSERT_NE(Find(a.Take(), PeerMessage::kRoundReady), nullptr);
  std::optional<Snapshot> first = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(first && first->encoded != nullptr);
  const uint64_t first_update = first->model->Digest();

  CoordinatorEvent refused;
  refused.set_task("dec");
  refused.mutable_join_refused()->set_round(1);
  a.Handle(refused);
  EXPECT_FALSE(a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE));

  a.Handle(RoundOpen(1));
  ASSERT_NE(Find(a.Take(), PeerMessage::kRoundReady), nullptr);
  std::optional<Snapshot> again = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(again && again->encoded != nullptr);
  EXPECT_EQ(again->model->Digest(), first_update);
  EXPECT_EQ(again->encoded->payload_bytes(), first->encoded->payload_bytes());
}

// Participants that disagree on the task's compression cannot fold each other's updates: the
// one expecting deltas refuses a model (and the other way round), naming the peer, and reports
// the error to the coordinator instead of averaging a model as if it were a delta.
TEST_F(DecentralizedCompressionTest, AnUpdateOfTheWrongKindIsRefused) {
  TestPeer a("peer-a", 0, 2, *train_, *test_, {}, CompressedSpec());
  TestPeer b("peer-b", 1, 2, *train_, *test_);
  for (TestPeer* p : {&a, &b}) {
    p->runner().Start();
    p->Handle(RoundOpen(1));
    p->Handle(PeerList(1, 1, {a.Endpoint(), b.Endpoint()}));
    p->Take();
  }
  a.Handle(StartSharing(1, 1));
  b.Handle(StartSharing(1, 1));
  const std::vector<PeerMessage> from_a = a.Take();
  const std::vector<PeerMessage> from_b = b.Take();
  EXPECT_EQ(Find(from_a, PeerMessage::kSharingDone), nullptr);
  EXPECT_EQ(Find(from_b, PeerMessage::kSharingDone), nullptr);
  const PeerMessage* error_a = Find(from_a, PeerMessage::kError);
  const PeerMessage* error_b = Find(from_b, PeerMessage::kError);
  ASSERT_NE(error_a, nullptr);
  ASSERT_NE(error_b, nullptr);
  EXPECT_THAT(error_a->error().message(),
              HasSubstr("peer peer-b served its round update as a model; this task's updates "
                        "travel as compressed deltas"));
  EXPECT_THAT(error_b->error().message(),
              HasSubstr("peer peer-a served its round update as a compressed delta"));
  EXPECT_EQ(DecentralizedRunnerProbe::ModelRound(a.runner()), 0u);
  EXPECT_EQ(DecentralizedRunnerProbe::ModelRound(b.runner()), 0u);
}

}  // namespace
}  // namespace shoal::peer
