// The order in which a decentralized participant fetches the round's updates (DecentralizedRunner
// driven event by event, real trainers and PeerServices on 127.0.0.1:0, a PeerClient that
// records the fetches): from the ids after its own first where the fold takes any order or the
// updates can wait (in memory, or on disk where the links are slow), in ascending id order
// otherwise; every participant ends each round with the same model either way.

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/peer_agent/modes/decentralized/decentralized_runner.h"
#include "tests/service/decentralized_test_peer.h"

namespace shoal::peer {
namespace {

using ::testing::UnorderedElementsAre;

// With mean, and a model whose updates take more than hold_bytes (0 here): in the first round,
// its fetches' speed not known yet, a peer fetches the others' updates two at a time in
// ascending id order, folding each in as it arrives, so that it never holds every participant's
// update; once its fetches ran slower than rotate_below_rate (here: any speed), from the ids
// after its own first, the updates that come before their turn waiting on disk. Every
// participant ends each round with the same model.
TEST_F(DecentralizedRunnerTest, TheMeanOfALargeModelFetchesInIdOrderUntilItsFetchesRanSlow) {
  const common::v1::TaskSpec spec = Spec();
  DecentralizedRunnerOptions options;
  options.hold_bytes = 0;
  options.rotate_below_rate = 1e15;
  TestPeer a("peer-a", 0, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer b("peer-b", 1, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer c("peer-c", 2, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer d("peer-d", 3, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer e("peer-e", 4, 5, *train_, *test_, {}, spec, "", 0, options);
  const std::vector<TestPeer*> all = {&c, &a, &b, &d, &e};
  for (TestPeer* p : all) p->runner().Start();
  auto address = [](const TestPeer& p) { return p.Endpoint().address(); };
  for (uint64_t round = 1; round <= 2; ++round) {
    SCOPED_TRACE(round);
    for (TestPeer* p : all) {
      p->Handle(RoundOpen(round));
      ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
    }
    c.gated().Gate(4 * round);
    std::set<uint64_t> digests;
    for (TestPeer* p : all) {
      p->Handle(PeerList(round, 1,
                         {e.Endpoint(), a.Endpoint(), d.Endpoint(), c.Endpoint(), b.Endpoint()}));
      p->Take();
      p->Handle(StartSharing(round, 1));
      const std::vector<PeerMessage> sent = p->Take();
      const PeerMessage* done = Find(sent, PeerMessage::kSharingDone);
      ASSERT_NE(done, nullptr);
      EXPECT_EQ(done->sharing_done().num_samples(), 5u * 160);
      digests.insert(done->sharing_done().digest_xxh3());
    }
    EXPECT_EQ(digests.size(), 1u);
    EXPECT_EQ(c.gated().max_in_flight(), 2u);
    const std::vector<std::string> started = c.gated().started_addresses();
    ASSERT_EQ(started.size(), 4 * round);
    const std::vector<std::string> by_c(started.end() - 4, started.end());
    if (round == 1) {
      // Ascending: the two lowest first (together, in either order), then the next two as the
      // lowest in flight come in; none waits on disk.
      EXPECT_THAT(std::vector<std::string>(by_c.begin(), by_c.begin() + 2),
                  UnorderedElementsAre(address(a), address(b)));
      EXPECT_THAT(std::vector<std::string>(by_c.begin() + 2, by_c.end()),
                  UnorderedElementsAre(address(d), address(e)));
      EXPECT_EQ(c.metrics().decentralized.updates_spilled.Value(), 0);
    } else {
      // The two after its own first, then the others as those come in (in either order too
      // where both came in before either of the others started). peer-a's fetch started only
      // once peer-d's or peer-e's was in, which then waited on disk.
      EXPECT_THAT(std::vector<std::string>(by_c.begin(), by_c.begin() + 2),
                  UnorderedElementsAre(address(d), address(e)));
      EXPECT_THAT(std::vector<std::string>(by_c.begin() + 2, by_c.end()),
                  UnorderedElementsAre(address(a), address(b)));
      EXPECT_GE(c.metrics().decentralized.updates_spilled.Value(), 1);
    }
  }
  // The storage of the updates folded goes back to the pool, which keeps at most the window and
  // two more. How much of it is there at the end depends on how the fetches overlapped (the
  // peer's own update, its aggregate and the round before's, its latest snapshot, are out of the
  // pool): that later rounds fetch into it is LaterRoundsReuseTheStorageOfTheRoundsBefore's
  // (decentralized_runner_test).
  for (TestPeer* p : all) {
    SCOPED_TRACE(p->Endpoint().peer_id());
    EXPECT_LE(DecentralizedRunnerProbe::KeptModelStorage(p->runner()).size(), 4u);
  }
}

// Before its first fetches a peer takes its own measured upload for its links' speed: a peer
// behind a slow uplink (2.5 MB/s, 20 Mbit/s) fetches a large model's updates from the ids after
// its own first from the first round on, one behind a fast one (1 GB/s) in ascending order.
TEST_F(DecentralizedRunnerTest, ThePeersMeasuredUploadChoosesTheFirstRoundsOrder) {
  const common::v1::TaskSpec spec = Spec();
  DecentralizedRunnerOptions options;
  options.hold_bytes = 0;
  TestPeer a("peer-a", 0, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer b("peer-b", 1, 5, *train_, *test_, {}, spec, "", 0, options, /*measured_upload=*/1e9);
  TestPeer c("peer-c", 2, 5, *train_, *test_, {}, spec, "", 0, options, /*measured_upload=*/2.5e6);
  TestPeer d("peer-d", 3, 5, *train_, *test_, {}, spec, "", 0, options);
  TestPeer e("peer-e", 4, 5, *train_, *test_, {}, spec, "", 0, options);
  for (TestPeer* p : {&a, &b, &c, &d, &e}) {
    p->runner().Start();
    p->Handle(RoundOpen(1));
    ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
  }
  std::set<uint64_t> digests;
  for (TestPeer* p : {&b, &c}) {
    p->gated().Gate(4);
    p->Handle(
        PeerList(1, 1, {e.Endpoint(), a.Endpoint(), d.Endpoint(), c.Endpoint(), b.Endpoint()}));
    p->Take();
    p->Handle(StartSharing(1, 1));
    const PeerMessage* done = Find(p->Take(), PeerMessage::kSharingDone);
    ASSERT_NE(done, nullptr);
    digests.insert(done->sharing_done().digest_xxh3());
  }
  EXPECT_EQ(digests.size(), 1u);
  auto address = [](const TestPeer& p) { return p.Endpoint().address(); };
  const std::vector<std::string> by_b = b.gated().started_addresses();
  ASSERT_EQ(by_b.size(), 4u);
  EXPECT_THAT(std::vector<std::string>(by_b.begin(), by_b.begin() + 2),
              UnorderedElementsAre(address(a), address(c)));
  EXPECT_EQ(b.metrics().decentralized.updates_spilled.Value(), 0);
  const std::vector<std::string> by_c = c.gated().started_addresses();
  ASSERT_EQ(by_c.size(), 4u);
  EXPECT_THAT(std::vector<std::string>(by_c.begin(), by_c.begin() + 2),
              UnorderedElementsAre(address(d), address(e)));
  EXPECT_GE(c.metrics().decentralized.updates_spilled.Value(), 1);
}

// Where the fold takes the updates in any order (exact sums), or a peer can hold every update
// (the float mean of a small model: those that come before their turn wait in the fold), each
// participant fetches from the ids after its own first and wraps around (so that from the start
// every participant's uplink serves a share of the fetches, where in id order all would fetch
// from the lowest ids first), still two at a time, and every participant ends the round with the
// same model.
void ExpectFetchesFromTheIdsAfterTheirOwnFirst(const common::v1::TaskSpec& spec,
                                               const training::RawDataset& train,
                                               const training::RawDataset& test) {
  TestPeer a("peer-a", 0, 4, train, test, {}, spec);
  TestPeer b("peer-b", 1, 4, train, test, {}, spec);
  TestPeer c("peer-c", 2, 4, train, test, {}, spec);
  TestPeer d("peer-d", 3, 4, train, test, {}, spec);
  for (TestPeer* p : {&a, &b, &c, &d}) {
    p->runner().Start();
    p->Handle(RoundOpen(1));
    ASSERT_NE(Find(p->Take(), PeerMessage::kRoundReady), nullptr);
  }
  std::vector<uint64_t> digests;
  for (TestPeer* p : {&c, &a}) {
    p->gated().Gate(3);
    p->Handle(PeerList(1, 1, {d.Endpoint(), a.Endpoint(), c.Endpoint(), b.Endpoint()}));
    p->Take();
    p->Handle(StartSharing(1, 1));
    const std::vector<PeerMessage> sent = p->Take();
    const PeerMessage* done = Find(sent, PeerMessage::kSharingDone);
    ASSERT_NE(done, nullptr);
    EXPECT_EQ(done->sharing_done().num_samples(), 4u * 160);
    digests.push_back(done->sharing_done().digest_xxh3());
    EXPECT_EQ(p->gated().max_in_flight(), 2u);
  }
  EXPECT_EQ(digests[0], digests[1]);
  // The first two start together (in either order), the third once one of them is in.
  auto address = [](const TestPeer& p) { return p.Endpoint().address(); };
  const std::vector<std::string> by_c = c.gated().started_addresses();
  ASSERT_EQ(by_c.size(), 3u);
  EXPECT_THAT(std::vector<std::string>(by_c.begin(), by_c.begin() + 2),
              UnorderedElementsAre(address(d), address(a)));
  EXPECT_EQ(by_c[2], address(b));
  const std::vector<std::string> by_a = a.gated().started_addresses();
  ASSERT_EQ(by_a.size(), 3u);
  EXPECT_THAT(std::vector<std::string>(by_a.begin(), by_a.begin() + 2),
              UnorderedElementsAre(address(b), address(c)));
  EXPECT_EQ(by_a[2], address(d));
}

TEST_F(DecentralizedRunnerTest, ExactSumsFetchFromTheIdsAfterTheirOwnFirst) {
  common::v1::TaskSpec spec = Spec();
  spec.mutable_aggregation_options()->set_exact_sum(true);
  ExpectFetchesFromTheIdsAfterTheirOwnFirst(spec, *train_, *test_);
}

TEST_F(DecentralizedRunnerTest, TheMeanOfASmallModelFetchesFromTheIdsAfterTheirOwnFirstToo) {
  ExpectFetchesFromTheIdsAfterTheirOwnFirst(Spec(), *train_, *test_);
}

}  // namespace
}  // namespace shoal::peer
