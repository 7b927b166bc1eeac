// DecentralizedRunner driven event by event, without a coordinator: each runner has a real
// Trainer (LibTorch, real Fashion-MNIST slice), a real PeerService on 127.0.0.1:0 and a
// PeerClient; the test plays the coordinator and reads what the runners send.

#include "services/peer_agent/modes/decentralized/decentralized_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/decentralized_test_peer.h"
#include "tests/testing/temp_dir.h"

namespace shoal::peer {
namespace {

TEST_F(DecentralizedRunnerTest, RoundEndsWithIdenticalModelsAndALateJoinerSyncs) {
  TestPeer a("peer-a", 0, 2, *train_, *test_);
  TestPeer b("peer-b", 1, 2, *train_, *test_);

  // Both start from the seed's model: ModelHeld{0} with the same digest.
  a.runner().Start();
  b.runner().Start();
  auto ma = a.Take();
  auto mb = b.Take();
  ASSERT_NE(Find(ma, PeerMessage::kModelHeld), nullptr);
  ASSERT_NE(Find(mb, PeerMessage::kModelHeld), nullptr);
  EXPECT_EQ(Find(ma, PeerMessage::kModelHeld)->model_held().round(), 0u);
  const uint64_t initial = Find(ma, PeerMessage::kModelHeld)->model_held().digest_xxh3();
  EXPECT_EQ(Find(mb, PeerMessage::kModelHeld)->model_held().digest_xxh3(), initial);

  // Round 1: join, train, publish ROUND_UPDATE, ready.
  a.Handle(RoundOpen(1));
  b.Handle(RoundOpen(1));
  ma = a.Take();
  ASSERT_NE(Find(ma, PeerMessage::kJoinRound), nullptr);
  const PeerMessage* ready = Find(ma, PeerMessage::kRoundReady);
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(ready->round_ready().num_samples(), 5u * 32u);
  auto update = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(update);
  EXPECT_EQ(update->round, 1u);
  EXPECT_EQ(update->num_samples, 160u);
  b.Take();

  // Connections: both reach each other.
  const std::vector<coordinator::v1::PeerEndpoint> both = {a.Endpoint(), b.Endpoint()};
  a.Handle(PeerList(1, 1, both));
  b.Handle(PeerList(1, 1, both));
  ma = a.Take();
  const PeerMessage* report = Find(ma, PeerMessage::kConnectionsReport);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->connections_report().attempt(), 1u);
  EXPECT_TRUE(report->connections_report().unreachable().empty());
  b.Take();

  // Sharing: both average the same updates into bit-identical models.
  a.Handle(StartSharing(1, 1));
  b.Handle(StartSharing(1, 1));
  ma = a.Take();
  mb = b.Take();
  const PeerMessage* da = Find(ma, PeerMessage::kSharingDone);
  const PeerMessage* db = Find(mb, PeerMessage::kSharingDone);
  ASSERT_NE(da, nullptr);
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(da->sharing_done().digest_xxh3(), db->sharing_done().digest_xxh3());
  EXPECT_NE(da->sharing_done().digest_xxh3(), initial);
  EXPECT_EQ(da->sharing_done().num_samples(), 320u);
  EXPECT_EQ(DecentralizedRunnerProbe::ModelRound(a.runner()), 1u);
  EXPECT_EQ(DecentralizedRunnerProbe::Held(a.runner()).Digest(), da->sharing_done().digest_xxh3());
  auto global = b.store().Get(peer::v1::SNAPSHOT_KIND_GLOBAL);
  ASSERT_TRUE(global);
  EXPECT_EQ(global->round, 1u);
  EXPECT_EQ(global->model->Digest(), da->sharing_done().digest_xxh3());
  EXPECT_GT(a.metrics().peer_bytes_pulled.Value(), 0);
  const uint64_t averaged = da->sharing_done().digest_xxh3();

  // ModelPublished: evaluate the averaged model.
  CoordinatorEvent published;
  published.set_task("dec");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  a.Handle(published);
  ma = a.Take();
  const PeerMessage* eval = Find(ma, PeerMessage::kEvalReport);
  ASSERT_NE(eval, nullptr);
  EXPECT_EQ(eval->eval_report().version(), 1u);
  EXPECT_GT(eval->eval_report().total(), 0u);

  // A late joiner syncs round 1 from b and holds the same model.
  TestPeer c("peer-c", 0, 3, *train_, *test_);
  c.runner().Start();
  c.Take();
  CoordinatorEvent sync;
  sync.set_task("dec");
  sync.mutable_sync_from()->set_round(1);
  *sync.mutable_sync_from()->mutable_provider() = b.Endpoint();
  c.Handle(sync);
  auto mc = c.Take();
  const PeerMessage* done = Find(mc, PeerMessage::kSyncDone);
  ASSERT_NE(done, nullptr);
  EXPECT_TRUE(done->sync_done().ok()) << done->sync_done().message();
  EXPECT_EQ(done->sync_done().digest_xxh3(), averaged);
  const PeerMessage* held = Find(mc, PeerMessage::kModelHeld);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->model_held().round(), 1u);
  EXPECT_EQ(held->model_held().digest_xxh3(), averaged);

  // A sync of a round the provider does not hold fails fast with SyncDone{ok: false}.
  sync.mutable_sync_from()->set_round(7);
  const absl::Time start = absl::Now();
  c.Handle(sync);
  mc = c.Take();
  done = Find(mc, PeerMessage::kSyncDone);
  ASSERT_NE(done, nullptr);
  EXPECT_FALSE(done->sync_done().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(DecentralizedRunnerProbe::ModelRound(c.runner()), 1u);
}

TEST_F(DecentralizedRunnerTest, RefusedJoinRestoresTheModelAndUnreachablePeersAreReported) {
  TestPeer a("peer-a", 0, 2, *train_, *test_);
  a.runner().Start();
  const uint64_t initial = DecentralizedRunnerProbe::Held(a.runner()).Digest();
  a.Take();
  a.Handle(RoundOpen(1));
  ASSERT_NE(Find(a.Take(), PeerMessage::kRoundReady), nullptr);

  // A participant nobody listens on is reported unreachable.
  coordinator::v1::PeerEndpoint ghost;
  ghost.set_peer_id("peer-ghost");
  ghost.set_address("127.0.0.1:1");
  a.Handle(PeerList(1, 1, {a.Endpoint(), ghost}));
  auto ma = a.Take();
  const PeerMessage* report = Find(ma, PeerMessage::kConnectionsReport);
  ASSERT_NE(report, nullptr);
  EXPECT_THAT(report->connections_report().unreachable(), ::testing::ElementsAre("peer-ghost"));
  EXPECT_EQ(a.metrics().decentralized.probes_failed.Value(), 1);

  // Removed from the round: back to the pre-round model, which a new round trains from.
  CoordinatorEvent failed;
  failed.set_task("dec");
  failed.mutable_connection_failed()->set_round(1);
  a.Handle(failed);
  EXPECT_EQ(DecentralizedRunnerProbe::ModelRound(a.runner()), 0u);
  EXPECT_EQ(DecentralizedRunnerProbe::Held(a.runner()).Digest(), initial);
  EXPECT_FALSE(a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE));

  // A RoundOpen for a round this peer cannot train (it holds round 0, not 4) is answered with
  // ModelHeld, so the coordinator can sync it.
  a.Handle(RoundOpen(5));
  ma = a.Take();
  EXPECT_EQ(Find(ma, PeerMessage::kJoinRound), nullptr);
  ASSERT_NE(Find(ma, PeerMessage::kModelHeld), nullptr);
  EXPECT_EQ(Find(ma, PeerMessage::kModelHeld)->model_held().round(), 0u);

  // JoinRefused mid-round also restores the model.
  a.Handle(RoundOpen(1));
  a.Take();
  CoordinatorEvent refused;
  refused.set_task("dec");
  refused.mutable_join_refused()->set_round(1);
  a.Handle(refused);
  EXPECT_EQ(DecentralizedRunnerProbe::Held(a.runner()).Digest(), initial);
  EXPECT_EQ(a.metrics().decentralized.rounds_refused.Value(), 2);
}

// Joins re-open while this peer's first JoinRound is on its way: the coordinator offers the
// round again, then refuses the first JoinRound (joins had closed again). The peer, trained and
// ready, answered the second offer; the refusal of the first does not take its update away.
TEST_F(DecentralizedRunnerTest, ARefusalOfAnEarlierOfferLeavesTheLaterJoinStanding) {
  TestPeer a("peer-a", 0, 2, *train_, *test_);
  a.runner().Start();
  a.Take();
  a.Handle(RoundOpen(1, 1));
  std::vector<PeerMessage> ms = a.Take();
  ASSERT_NE(Find(ms, PeerMessage::kJoinRound), nullptr);
  EXPECT_EQ(Find(ms, PeerMessage::kJoinRound)->join_round().offer(), 1u);
  ASSERT_NE(Find(ms, PeerMessage::kRoundReady), nullptr);
  auto update = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(update);

  // The second offer is answered again without training again, naming that offer.
  a.Handle(RoundOpen(1, 2));
  ms = a.Take();
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].join_round().offer(), 2u);
  EXPECT_TRUE(ms[1].has_round_ready());

  // The refusal of offer 1 neither stops the worker's current step nor ends the round here.
  EXPECT_FALSE(a.runner().Supersedes(JoinRefused(1, 1)));
  a.Handle(JoinRefused(1, 1));
  EXPECT_EQ(a.metrics().decentralized.rounds_refused.Value(), 0);
  auto kept = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->model->Digest(), update->model->Digest());
  a.Handle(PeerList(1, 1, {a.Endpoint()}));
  EXPECT_NE(Find(a.Take(), PeerMessage::kConnectionsReport), nullptr);

  // A refusal of the latest offer, or of no offer in particular, still ends the round.
  EXPECT_TRUE(a.runner().Supersedes(JoinRefused(1, 2)));
  EXPECT_TRUE(a.runner().Supersedes(JoinRefused(1)));
  a.Handle(JoinRefused(1, 2));
  EXPECT_EQ(a.metrics().decentralized.rounds_refused.Value(), 1);
  EXPECT_FALSE(a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE));
}

TEST_F(DecentralizedRunnerTest, EvaluationWaitsWhenTheNextRoundIsAlreadyOpen) {
  TestPeer a("peer-a", 0, 2, *train_, *test_);
  a.runner().Start();
  a.Take();
  a.Handle(RoundOpen(1));
  a.Handle(PeerList(1, 1, {a.Endpoint()}));
  a.Handle(StartSharing(1, 1));
  ASSERT_EQ(DecentralizedRunnerProbe::ModelRound(a.runner()), 1u);
  a.Take();

  // ModelPublished{1} with RoundOpen{2} queued behind it: no evaluation yet.
  CoordinatorEvent published;
  published.set_task("dec");
  published.mutable_model_published()->set_round(1);
  published.mutable_model_published()->set_version(1);
  a.HandleSuperseded(published);
  EXPECT_EQ(Find(a.Take(), PeerMessage::kEvalReport), nullptr);

  // Round 2: JoinRound first, then the EvalReport of version 1, then training and RoundReady;
  // the trained parameters are what the trainer holds.
  a.Handle(RoundOpen(2));
  std::vector<PeerMessage> ms = a.Take();
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_TRUE(ms[0].has_join_round());
  ASSERT_TRUE(ms[1].has_eval_report());
  EXPECT_EQ(ms[1].eval_report().version(), 1u);
  EXPECT_TRUE(ms[2].has_round_ready());
  auto update = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(update);
  auto params = a.trainer().GetParameters();
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(params->Digest(), update->model->Digest());
}

// Test-only fault injection: the update other peers fetch is base + factor · (trained − base);
// the peer's own parameters stay what it trained.
TEST_F(DecentralizedRunnerTest, ByzantinePeerSharesACorruptedUpdateAndKeepsItsOwnModel) {
  absl::StatusOr<ByzantineFault> fault = ByzantineFault::Parse("scale:-10");
  ASSERT_TRUE(fault.ok()) << fault.status();
  TestPeer byzantine("peer-a", 0, 2, *train_, *test_, *fault);
  TestPeer honest("peer-b", 0, 2, *train_, *test_);  // same shard: trains the same weights
  for (TestPeer* p : {&byzantine, &honest}) {
    p->runner().Start();
    p->Handle(RoundOpen(1));
    ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
  }
  const tensor::FlatModel base =
      DecentralizedRunnerProbe::Held(byzantine.runner());  // round 0, before training
  auto trained = byzantine.trainer().GetParameters();
  auto honest_trained = honest.trainer().GetParameters();
  ASSERT_TRUE(trained.ok() && honest_trained.ok());
  EXPECT_EQ(trained->Digest(), honest_trained->Digest());
  auto shared = byzantine.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  auto honest_shared = honest.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
  ASSERT_TRUE(shared && honest_shared);
  EXPECT_EQ(honest_shared->model->Digest(), honest_trained->Digest());
  ASSERT_EQ(shared->model->values.size(), base.values.size());
  for (size_t i = 0; i < base.values.size(); ++i) {
    const float want = base.values[i] - 10.0f * (trained->values[i] - base.values[i]);
    ASSERT_NEAR(shared->model->values[i], want, 1e-5 + 1e-5 * std::fabs(want)) << i;
  }
  EXPECT_NE(shared->model->Digest(), trained->Digest());
}

// Once a peer keeps a full set of buffers, a round touches no fresh model-sized memory: the
// trained parameters are read into, and the aggregate written into, storage that was kept for
// reuse or in use at the end of the round before (folded updates, the round before's own update,
// the model held before it). How many buffers the first rounds leave kept depends on whether a
// round's two fetches overlapped (one buffer serves both when the first is folded before the
// second starts), so after round 3 the test tops the set up to the pool's four; a runner that
// gave nothing back would use them up in round 4 and allocate in round 5.
TEST_F(DecentralizedRunnerTest, LaterRoundsReuseTheStorageOfTheRoundsBefore) {
  TestPeer a("peer-a", 0, 3, *train_, *test_);
  TestPeer b("peer-b", 1, 3, *train_, *test_);
  TestPeer c("peer-c", 2, 3, *train_, *test_);
  const std::vector<TestPeer*> all = {&a, &b, &c};
  const std::vector<coordinator::v1::PeerEndpoint> endpoints = {a.Endpoint(), b.Endpoint(),
                                                                c.Endpoint()};
  for (TestPeer* p : all) p->runner().Start();
  const float* held_before = nullptr;  // the storage of the model peer-a held a round earlier
  std::set<const float*> known;        // storage peer-a kept or used at the end of a round
  for (uint64_t round = 1; round <= 7; ++round) {
    for (TestPeer* p : all) {
      p->Handle(RoundOpen(round));
      ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr) << round;
    }
    auto update = a.store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
    ASSERT_TRUE(update);
    const float* trained = update->model->values.data();
    update.reset();
    for (TestPeer* p : all) {
      p->Handle(PeerList(round, 1, endpoints));
      p->Take();
      p->Handle(StartSharing(round, 1));
      ASSERT_NE(Find(p->Take(), PeerMessage::kSharingDone), nullptr) << round;
    }
    ASSERT_EQ(DecentralizedRunnerProbe::ModelRound(a.runner()), round);
    const float* held = DecentralizedRunnerProbe::Held(a.runner()).values.data();
    if (round >= 4) {
      EXPECT_TRUE(known.contains(trained)) << "round " << round << ": trained into fresh memory";
      EXPECT_TRUE(known.contains(held)) << "round " << round << ": aggregated into fresh memory";
    }
    if (round == 3) {
      DecentralizedRunnerProbe::KeepModelBuffers(
          a.runner(), 4, DecentralizedRunnerProbe::Held(a.runner()).values.size());
    }
    known = DecentralizedRunnerProbe::KeptModelStorage(a.runner());
    EXPECT_LE(known.size(), 4u);  // fetch_window + 2
    known.insert({trained, held, held_before});
    held_before = held;
  }
}

// The round is aggregated with the task's strategy (here the coordinate-wise median) over the
// deltas against the round's base: three participants that list each other in different
// orders end bit-identical. A Byzantine participant's corrupted update is what every one of
// them aggregates, itself included; with max_update_norm it is left out everywhere.
TEST_F(DecentralizedRunnerTest, EveryParticipantAggregatesWithTheTaskStrategyIdentically) {
  absl::StatusOr<ByzantineFault> fault = ByzantineFault::Parse("scale:1000");
  ASSERT_TRUE(fault.ok()) << fault.status();
  for (const double bound : {0.0, 50.0}) {
    SCOPED_TRACE(bound);
    common::v1::TaskSpec spec = Spec();
    spec.set_aggregation(common::v1::AGGREGATION_MEDIAN);
    spec.set_max_update_norm(bound);
    TestPeer a("peer-a", 0, 3, *train_, *test_, *fault, spec);
    TestPeer b("peer-b", 1, 3, *train_, *test_, {}, spec);
    TestPeer c("peer-c", 2, 3, *train_, *test_, {}, spec);
    std::vector<TestPeer*> all = {&a, &b, &c};
    for (TestPeer* p : all) {
      p->runner().Start();
      p->Handle(RoundOpen(1));
      ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
    }
    // What the bound separates: the honest deltas are far below it, the Byzantine one far above.
    const tensor::FlatModel base = DecentralizedRunnerProbe::Held(a.runner());
    for (TestPeer* p : all) {
      auto update = p->store().Get(peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
      ASSERT_TRUE(update);
      double norm = 0;
      for (size_t i = 0; i < base.values.size(); ++i) {
        const double d = static_cast<double>(update->model->values[i]) - base.values[i];
        norm += d * d;
      }
      if (p == &a) {
        ASSERT_GT(std::sqrt(norm), 500);
      } else {
        ASSERT_LT(std::sqrt(norm), 10);
      }
    }
    a.Handle(PeerList(1, 1, {a.Endpoint(), b.Endpoint(), c.Endpoint()}));
    b.Handle(PeerList(1, 1, {c.Endpoint(), b.Endpoint(), a.Endpoint()}));
    c.Handle(PeerList(1, 1, {b.Endpoint(), a.Endpoint(), c.Endpoint()}));
    for (TestPeer* p : all) p->Take();
    std::vector<uint64_t> digests;
    for (TestPeer* p : {&c, &a, &b}) {
      p->Handle(StartSharing(1, 1));
      const std::vector<PeerMessage> sent = p->Take();
      const PeerMessage* done = Find(sent, PeerMessage::kSharingDone);
      ASSERT_NE(done, nullptr);
      digests.push_back(done->sharing_done().digest_xxh3());
      EXPECT_EQ(done->sharing_done().num_samples(), bound > 0 ? 320u : 480u);
      EXPECT_EQ(p->metrics().decentralized.updates_excluded.Value(), bound > 0 ? 1 : 0);
      EXPECT_EQ(DecentralizedRunnerProbe::Held(p->runner()).Digest(),
                done->sharing_done().digest_xxh3());
    }
    EXPECT_EQ(digests[0], digests[1]);
    EXPECT_EQ(digests[1], digests[2]);
    // The median of three ignores the outlier even without the bound: the model stays near
    // the honest ones.
    double moved = 0;
    for (size_t i = 0; i < base.values.size(); ++i) {
      moved = std::max(
          moved,
          std::fabs(static_cast<double>(DecentralizedRunnerProbe::Held(a.runner()).values[i]) -
                    base.values[i]));
    }
    EXPECT_LT(moved, 1.0);
  }
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t HeldDigest(const std::vector<PeerMessage>& sent, uint64_t round) {
  const PeerMessage* held = Find(sent, PeerMessage::kModelHeld);
  EXPECT_NE(held, nullptr);
  if (held == nullptr) return 0;
  EXPECT_EQ(held->model_held().round(), round);
  return held->model_held().digest_xxh3();
}

// With a state directory a peer keeps the model of the last round it completed on disk: started
// again it holds that model (ModelHeld names its round and digest) and serves it to peers that
// sync. A file that does not read back is passed over; the file goes when the task finishes; in
// another run of a task of the same name the peer starts from the initial model.
TEST_F(DecentralizedRunnerTest, APeerStartedAgainHoldsTheModelItKeptOnDisk) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("kept-model");
  ASSERT_TRUE(dir.ok()) << dir.status();
  constexpr int64_t kRun = 1700000000000;
  const std::string kept = absl::StrCat("decentralized-dec-", kRun, "-round-1.model");
  // Files of four tasks this peer left: the first round kept leaves the three written last.
  for (int i = 0; i < 4; ++i) {
    const std::string left = absl::StrCat(*dir, "/decentralized-left-", i, "-5-round-1.model");
    std::ofstream(left) << "model";
    std::filesystem::last_write_time(
        left, std::filesystem::file_time_type::clock::now() - std::chrono::hours(4 - i));
  }
  const std::vector<std::string> left = {"decentralized-left-1-5-round-1.model",
                                         "decentralized-left-2-5-round-1.model",
                                         "decentralized-left-3-5-round-1.model"};
  std::vector<std::string> kept_and_left = {kept};
  kept_and_left.insert(kept_and_left.end(), left.begin(), left.end());
  uint64_t averaged = 0;
  uint64_t initial = 0;
  {
    TestPeer a("peer-a", 0, 2, *train_, *test_, {}, Spec(), *dir, kRun);
    TestPeer b("peer-b", 1, 2, *train_, *test_);
    a.runner().Start();
    b.runner().Start();
    initial = HeldDigest(a.Take(), 0);
    EXPECT_EQ(FilesIn(*dir).size(), 4u);  // round 0's model every peer makes from the seed
    for (TestPeer* p : {&a, &b}) p->Handle(RoundOpen(1));
    for (TestPeer* p : {&a, &b}) p->Handle(PeerList(1, 1, {a.Endpoint(), b.Endpoint()}));
    for (TestPeer* p : {&a, &b}) p->Handle(StartSharing(1, 1));
    const std::vector<PeerMessage> sent = a.Take();
    const PeerMessage* done = Find(sent, PeerMessage::kSharingDone);
    ASSERT_NE(done, nullptr);
    averaged = done->sharing_done().digest_xxh3();
    // Kept before SharingDone went out: once every participant's arrived, the coordinator counts
    // the round complete, and a peer killed from then on holds it when started again.
    EXPECT_EQ(FilesIn(*dir), kept_and_left);
    const auto kept_at = std::filesystem::last_write_time(*dir + "/" + kept);
    CoordinatorEvent published;
    published.set_task("dec");
    published.mutable_model_published()->set_round(1);
    published.mutable_model_published()->set_version(1);
    a.Handle(published);
    EXPECT_EQ(FilesIn(*dir), kept_and_left);
    EXPECT_EQ(std::filesystem::last_write_time(*dir + "/" + kept), kept_at);  // not written again
  }
  // A newer round's file that does not read back, and a temporary a crash mid-write left.
  for (const std::string& name :
       {absl::StrCat("decentralized-dec-", kRun, "-round-2.model"),
        absl::StrCat("decentralized-dec-", kRun, "-round-3.model.tmp.7")}) {
    std::ofstream out(*dir + "/" + name);
    out << "SHOALMDL";
  }
  // The peer started again: round 1's model, served to peers that sync; the torn file is gone.
  TestPeer again("peer-a", 0, 2, *train_, *test_, {}, Spec(), *dir, kRun);
  again.runner().Start();
  EXPECT_EQ(HeldDigest(again.Take(), 1), averaged);
  auto global = again.store().Get(peer::v1::SNAPSHOT_KIND_GLOBAL);
  ASSERT_TRUE(global);
  EXPECT_EQ(global->round, 1u);
  EXPECT_EQ(global->model->Digest(), averaged);
  EXPECT_EQ(FilesIn(*dir), kept_and_left);
  // The task finishes: what was kept for it goes.
  const std::string copy = *dir + "/copy-of-round-1";
  std::filesystem::copy_file(*dir + "/" + kept, copy);
  again.runner().Finished();
  EXPECT_EQ(FilesIn(*dir),
            std::vector<std::string>({"copy-of-round-1", left[0], left[1], left[2]}));
  // Another run of a task of the same name: the initial model, and the other run's file goes.
  std::filesystem::rename(copy, *dir + "/" + kept);
  TestPeer other("peer-a", 0, 2, *train_, *test_, {}, Spec(), *dir, kRun + 1);
  other.runner().Start();
  EXPECT_EQ(HeldDigest(other.Take(), 0), initial);
  EXPECT_EQ(FilesIn(*dir), left);
}

// A peer removed from a round after it aggregated it goes back to the model of the round before,
// on disk too: started again it must not hold a round the coordinator never counted.
TEST_F(DecentralizedRunnerTest, APeerRemovedAfterAggregatingKeepsTheRoundBeforeAgain) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("kept-model-removed");
  ASSERT_TRUE(dir.ok()) << dir.status();
  constexpr int64_t kRun = 1700000000000;
  TestPeer a("peer-a", 0, 2, *train_, *test_, {}, Spec(), *dir, kRun);
  TestPeer b("peer-b", 1, 2, *train_, *test_);
  a.runner().Start();
  b.runner().Start();
  const uint64_t initial = HeldDigest(a.Take(), 0);
  for (TestPeer* p : {&a, &b}) p->Handle(RoundOpen(1));
  for (TestPeer* p : {&a, &b}) p->Handle(PeerList(1, 1, {a.Endpoint(), b.Endpoint()}));
  for (TestPeer* p : {&a, &b}) p->Handle(StartSharing(1, 1));
  ASSERT_NE(Find(a.Take(), PeerMessage::kSharingDone), nullptr);
  EXPECT_THAT(FilesIn(*dir),
              ::testing::ElementsAre(absl::StrCat("decentralized-dec-", kRun, "-round-1.model")));
  CoordinatorEvent failed;
  failed.set_task("dec");
  failed.mutable_connection_failed()->set_round(1);
  failed.mutable_connection_failed()->set_reason("peer-b stopped answering");
  a.Handle(failed);
  EXPECT_THAT(FilesIn(*dir),
              ::testing::ElementsAre(absl::StrCat("decentralized-dec-", kRun, "-round-0.model")));
  TestPeer again("peer-a", 0, 2, *train_, *test_, {}, Spec(), *dir, kRun);
  again.runner().Start();
  EXPECT_EQ(HeldDigest(again.Take(), 0), initial);
}

}  // namespace
}  // namespace shoal::peer
