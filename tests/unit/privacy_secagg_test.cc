#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/secagg_federation.h"

namespace shoal::privacy::secagg {
namespace {

using fixture::Config;
using fixture::Drop;
using fixture::Federation;
using fixture::Id;
using ::testing::HasSubstr;

TEST(SecAggGraphTest, CompleteWhenTheDegreeCoversEveryone) {
  for (int degree : {9, 20}) {
    std::vector<std::string> ids;
    for (int i = 0; i < 10; ++i) ids.push_back(Id(i));
    auto graph = NeighbourhoodGraph::Create(ids, degree, "");  // no seed needed
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_TRUE(graph->complete());
    for (const std::string& id : ids) {
      EXPECT_EQ(graph->Neighbours(id).size(), 9u);
      EXPECT_FALSE(graph->AreNeighbours(id, id));
    }
  }
}

TEST(SecAggGraphTest, HararyGraphIsSymmetricOfTheDegreeAndDrawnFromTheSeed) {
  const std::string seed(kSharedSeedSize, '\x07');
  // (participants, degree, the degree every participant gets)
  for (auto [n, degree, expected] : {std::tuple{30, 8, 8}, {30, 7, 7}, {31, 7, 8}, {12, 2, 2}}) {
    SCOPED_TRACE(testing::Message() << n << " participants, degree " << degree);
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(Id(i));
    auto graph = NeighbourhoodGraph::Create(ids, degree, seed);
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_FALSE(graph->complete());
    EXPECT_EQ(graph->min_degree(), expected);
    EXPECT_EQ(graph->max_degree(), expected);
    for (const std::string& a : ids) {
      for (const std::string& b : graph->Neighbours(a)) EXPECT_TRUE(graph->AreNeighbours(b, a));
    }
    // The same set in another order gives the same graph; another seed another graph.
    std::vector<std::string> reversed(ids.rbegin(), ids.rend());
    auto again = NeighbourhoodGraph::Create(reversed, degree, seed);
    auto other = NeighbourhoodGraph::Create(ids, degree, std::string(kSharedSeedSize, '\x08'));
    ASSERT_TRUE(again.ok() && other.ok());
    bool differs = false;
    for (const std::string& id : ids) {
      EXPECT_EQ(again->Neighbours(id), graph->Neighbours(id));
      differs = differs || other->Neighbours(id) != graph->Neighbours(id);
    }
    EXPECT_TRUE(differs);
  }
}

// --- Configuration ---------------------------------------------------------------------------

TEST(SecAggConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* expected;
    void (*change)(v1::SecAggConfig&);
  };
  const Case cases[] = {
      {"SecAggConfig.round_id: is empty", [](v1::SecAggConfig& c) { c.clear_round_id(); }},
      {"SecAggConfig.participant_ids: 2 participants",
       [](v1::SecAggConfig& c) { c.mutable_participant_ids()->DeleteSubrange(2, 8); }},
      {"SecAggConfig.participant_ids[3]: \"peer-1\" is listed twice",
       [](v1::SecAggConfig& c) { c.set_participant_ids(3, "peer-1"); }},
      {"SecAggConfig.participant_ids[0]: is empty",
       [](v1::SecAggConfig& c) { c.set_participant_ids(0, ""); }},
      {"SecAggConfig.neighbourhood_size: must be at least 2, got 1",
       [](v1::SecAggConfig& c) { c.set_neighbourhood_size(1); }},
      {"SecAggConfig.graph_seed: must be 32 bytes, got 3",
       [](v1::SecAggConfig& c) { c.set_graph_seed("abc"); }},
      {"SecAggConfig.ring_bits: must be in [1, 32], got 33",
       [](v1::SecAggConfig& c) { c.set_ring_bits(33); }},
      {"SecAggConfig.vector_length: must be in [1, ",
       [](v1::SecAggConfig& c) { c.set_vector_length(0); }},
      {"SecAggConfig.threshold: must be at least 2, got 1",
       [](v1::SecAggConfig& c) { c.set_threshold(1); }},
      {"SecAggConfig.threshold: 7 exceeds the 6 neighbours",
       [](v1::SecAggConfig& c) { c.set_threshold(7); }},
      {"SecAggConfig.threshold: 3 must be more than half of the largest neighbourhood (6",
       [](v1::SecAggConfig& c) { c.set_threshold(3); }},
  };
  ASSERT_TRUE(SecAggRound::Create(Config(10, 6, 4, 32, 8)).ok());
  for (const Case& c : cases) {
    v1::SecAggConfig config = Config(10, 6, 4, 32, 8);
    c.change(config);
    auto round = SecAggRound::Create(config);
    EXPECT_EQ(round.status().code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(round.status().message(), HasSubstr(c.expected));
  }
  // The complete graph reads no seed.
  v1::SecAggConfig complete = Config(5, 4, 3, 32, 8);
  complete.clear_graph_seed();
  EXPECT_TRUE(SecAggRound::Create(complete).ok());
  // The client and server take the same config through the same checks.
  v1::SecAggConfig bad = Config(10, 6, 4, 32, 8);
  bad.set_ring_bits(0);
  EXPECT_THAT(SecAggServer::Create(bad, nullptr).status().message(), HasSubstr("ring_bits"));
  EXPECT_THAT(
      SecAggClient::Create(Config(3, 2, 2, 32, 8), "peer-9", nullptr, nullptr).status().message(),
      HasSubstr("\"peer-9\" is not a participant"));
}

// --- Rounds with dropouts ----------------------------------------------------------------------

struct Shape {
  int peers;
  int neighbourhood;
  int threshold;
};

std::string ShapeName(const Shape& s) {
  return absl::StrCat(s.peers, " peers, neighbourhood ", s.neighbourhood, ", threshold ",
                      s.threshold);
}

TEST(SecAggRoundTest, NoDropoutsGiveTheExactSum) {
  for (auto [shape, bits] : {std::pair{Shape{3, 2, 2}, 13},
                             {Shape{10, 9, 5}, 32},
                             {Shape{30, 8, 5}, 20},
                             {Shape{30, 29, 16}, 32}}) {
    SCOPED_TRACE(testing::Message() << ShapeName(shape) << ", " << bits << " bits");
    Federation f(Config(shape.peers, shape.neighbourhood, shape.threshold, bits, 37));
    auto sum = f.Run();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, f.ExpectedSum());
    EXPECT_EQ(f.server().survivors(), f.ExpectedSurvivors());
  }
}

// For each step, the most dropouts the round tolerates (all among one participant's neighbours,
// the hardest place for them) give the exact sum of the survivors; one more fails the round
// clearly.
TEST(SecAggRoundTest, TolerableDropoutsAtEachStepGiveTheSurvivorsSumOneMoreFails) {
  for (Shape shape : {Shape{3, 2, 2}, Shape{10, 9, 5}, Shape{30, 8, 5}}) {
    const v1::SecAggConfig config =
        Config(shape.peers, shape.neighbourhood, shape.threshold, 32, 19);
    auto round = SecAggRound::Create(config);
    ASSERT_TRUE(round.ok()) << round.status();
    const std::vector<std::string>& neighbours = round->graph().Neighbours(Id(0));
    const int tolerated = round->graph().min_degree() - shape.threshold;
    for (Drop step : {Drop::kBeforeAdvertising, Drop::kBeforeSharing, Drop::kBeforeMasking,
                      Drop::kBeforeSigning, Drop::kBeforeUnmasking}) {
      for (int dropouts : {tolerated, tolerated + 1}) {
        SCOPED_TRACE(testing::Message() << ShapeName(shape) << "; " << dropouts
                                        << " drop out before step " << static_cast<int>(step) + 1);
        Federation f(config, dropouts);
        for (int i = 0; i < dropouts; ++i) f.DropAt(neighbours[i], step);
        auto sum = f.Run();
        if (dropouts == tolerated) {
          ASSERT_TRUE(sum.ok()) << sum.status();
          EXPECT_EQ(*sum, f.ExpectedSum());
          EXPECT_EQ(f.server().survivors(), f.ExpectedSurvivors());
        } else {
          EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
          EXPECT_THAT(sum.status().message(), HasSubstr("fewer than the threshold"));
          // The failure is final: the server returns it, not a sum, from then on.
          EXPECT_EQ(f.server().CloseUnmasking().status().code(),
                    absl::StatusCode::kFailedPrecondition);
        }
      }
    }
  }
}

// The complete graphs of 10 and 30 peers tolerate n - 1 - t dropouts over the whole round: here
// spread over the five steps in turn.
TEST(SecAggRoundTest, DropoutsSpreadOverEveryStepGiveTheSurvivorsSum) {
  for (Shape shape : {Shape{10, 9, 5}, Shape{30, 29, 16}}) {
    SCOPED_TRACE(ShapeName(shape));
    Federation f(Config(shape.peers, shape.neighbourhood, shape.threshold, 32, 101));
    const int dropouts = shape.peers - 1 - shape.threshold;
    int after_masking = 0;
    for (int i = 0; i < dropouts; ++i) {
      const Drop step = static_cast<Drop>(i % 5);
      f.DropAt(Id(1 + i), step);
      if (step > Drop::kBeforeMasking) ++after_masking;
    }
    auto sum = f.Run();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, f.ExpectedSum());
    // Those that dropped out before signing or unmasking sent their masked inputs: they are in
    // the sum.
    EXPECT_EQ(f.server().survivors(), f.ExpectedSurvivors());
    EXPECT_EQ(f.server().survivors().size(),
              static_cast<size_t>(shape.peers - dropouts + after_masking));
  }
}

// What the server sees of an input is masked: no masked input matches its input anywhere
// (chance 2^-32 per value), and the masked inputs sum to something else than the inputs (the self
// masks stay until unmasking).
TEST(SecAggRoundTest, TheServerSeesOnlyMaskedInputs) {
  Federation f(Config(10, 4, 3, 32, 64));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  ASSERT_TRUE(f.Check().ok());
  std::vector<uint32_t> masked_sum(64, 0);
  for (int p = 0; p < 10; ++p) {
    const std::vector<uint32_t> masked = f.masked(Id(p));
    const std::vector<uint32_t>& input = f.input(Id(p));
    for (size_t i = 0; i < input.size(); ++i) EXPECT_NE(masked[i], input[i]) << Id(p) << " " << i;
    ASSERT_TRUE(RingAdd(absl::MakeSpan(masked_sum), masked, 32).ok());
  }
  const std::vector<uint32_t> expected = f.ExpectedSum();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NE(masked_sum[i], expected[i]) << i;
  auto sum = f.Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, expected);
}

TEST(SecAggRoundTest, FixedPointUpdatesDecodeToTheirSum) {
  constexpr int kPeers = 6;
  auto codec = FixedPointCodec::Create({.clip_range = 1.0, .max_summands = kPeers, .bits = 24});
  ASSERT_TRUE(codec.ok()) << codec.status();
  Federation f(Config(kPeers, 5, 3, codec->bits(), 64));
  std::vector<double> expected(64, 0.0);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int p = 0; p < kPeers; ++p) {
    std::vector<float> update(64);
    for (float& x : update) x = u(rng);
    auto encoded = codec->Encode(update);
    ASSERT_TRUE(encoded.ok());
    f.input(Id(p)) = *encoded;
    if (p != 1) {
      for (size_t i = 0; i < update.size(); ++i) expected[i] += update[i];
    }
  }
  f.DropAt(Id(1), Drop::kBeforeMasking);
  auto sum = f.Run();
  ASSERT_TRUE(sum.ok()) << sum.status();
  auto decoded = codec->DecodeSum(*sum, static_cast<int>(f.server().survivors().size()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR((*decoded)[i], expected[i], kPeers * codec->quantum() / 2);
  }
}

// --- Timing ------------------------------------------------------------------------------------

// 16 peers, complete graph, a vector of 2^20 elements, one dropout after sharing: prints the time
// each side takes (not asserted; this machine's load decides it).
TEST(SecAggRoundTest, MillionElementsSixteenPeersTimed) {
  constexpr int kPeers = 16;
  constexpr int kLength = 1 << 20;
  Federation f(Config(kPeers, kPeers - 1, 8, 32, kLength));
  f.DropAt(Id(5), Drop::kBeforeMasking);
  auto sum = f.Run();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.ExpectedSum());
  std::printf(
      "secagg round, %d peers (one dropped after sharing), %d elements: the peers %.2f s in all "
      "(%.3f s each), the server %.2f s\n",
      kPeers, kLength, f.client_seconds(), f.client_seconds() / kPeers, f.server_seconds());
}

}  // namespace
}  // namespace shoal::privacy::secagg
