#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/fixed_point.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/client.h"
#include "libs/privacy/secagg/graph.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/round.h"
#include "libs/privacy/secagg/server.h"

namespace shoal::privacy::secagg {
namespace {

using ::testing::HasSubstr;

// When a participant stops sending: never (kNone), or before the step named.
enum class Drop { kBeforeAdvertising, kBeforeSharing, kBeforeMasking, kBeforeUnmasking, kNone };

std::string Id(int i) { return absl::StrCat("peer-", i); }

v1::SecAggConfig Config(int n, int k, int t, int bits, uint64_t length) {
  v1::SecAggConfig config;
  config.set_round_id("task-7/round-3");
  for (int i = 0; i < n; ++i) config.add_participant_ids(Id(i));
  config.set_threshold(t);
  config.set_neighbourhood_size(k);
  config.set_graph_seed(std::string(kSharedSeedSize, '\x42'));
  config.set_ring_bits(bits);
  config.set_vector_length(length);
  return config;
}

// Runs `call`, adding its duration to `seconds`.
template <typename Call>
auto Timed(double& seconds, Call call) {
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// The participants (each with an Ed25519 identity and a random input), a server, and the honest
// messages of each step; a test may alter them between steps, as a malicious aggregator would.
class Federation {
 public:
  explicit Federation(const v1::SecAggConfig& config, uint64_t input_seed = 1) : config_(config) {
    std::map<std::string, std::string> identity_keys;
    for (const std::string& id : config.participant_ids()) {
      auto identity = GenerateEd25519KeyPair();
      EXPECT_TRUE(identity.ok()) << identity.status();
      identity_keys[id] = identity->public_key;
      auto signer = Ed25519KeySigner::Create(identity->private_key);
      EXPECT_TRUE(signer.ok()) << signer.status();
      signers_[id] = *std::move(signer);
    }
    auto verifier = Ed25519KeyVerifier::Create(identity_keys);
    EXPECT_TRUE(verifier.ok()) << verifier.status();
    verifier_ = *std::move(verifier);
    auto server = SecAggServer::Create(config, verifier_);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    std::mt19937 rng(static_cast<uint32_t>(input_seed));
    const uint32_t mask =
        config.ring_bits() == 32 ? 0xffffffffu : (uint32_t{1} << config.ring_bits()) - 1;
    for (const std::string& id : config.participant_ids()) {
      auto client = SecAggClient::Create(config, id, signers_[id], verifier_);
      EXPECT_TRUE(client.ok()) << client.status();
      clients_[id] = *std::move(client);
      std::vector<uint32_t>& input = inputs_[id];
      input.resize(config.vector_length());
      for (uint32_t& v : input) v = rng() & mask;
    }
  }

  void DropAt(const std::string& id, Drop drop) { drops_[id] = drop; }
  bool Sends(const std::string& id, Drop step) const {
    auto it = drops_.find(id);
    return it == drops_.end() || it->second > step;
  }

  // Each step: the participants still in the round answer what the server sent them. A
  // participant's refusal is a test failure here (INTERNAL), never mistaken for the server's.
  absl::Status Advertise() {
    for (auto& [id, client] : clients_) {
      if (!Sends(id, Drop::kBeforeAdvertising)) continue;
      auto keys = Timed(client_seconds_, [&] { return client->AdvertiseKeys(); });
      if (!keys.ok()) return Refused(id, keys.status());
      if (absl::Status s =
              Timed(server_seconds_, [&] { return server_->AddAdvertisedKeys(*keys); });
          !s.ok()) {
        return s;
      }
    }
    auto bundles = Timed(server_seconds_, [&] { return server_->CloseAdvertising(); });
    if (!bundles.ok()) return bundles.status();
    bundles_ = *std::move(bundles);
    return absl::OkStatus();
  }
  absl::Status Share() {
    for (const auto& [id, bundle] : bundles_) {
      if (!Sends(id, Drop::kBeforeSharing)) continue;
      auto shares = Timed(client_seconds_, [&] { return clients_.at(id)->ShareKeys(bundle); });
      if (!shares.ok()) return Refused(id, shares.status());
      if (absl::Status s = Timed(server_seconds_, [&] { return server_->AddShares(*shares); });
          !s.ok()) {
        return s;
      }
    }
    auto relayed = Timed(server_seconds_, [&] { return server_->CloseSharing(); });
    if (!relayed.ok()) return relayed.status();
    relayed_ = *std::move(relayed);
    return absl::OkStatus();
  }
  absl::Status Mask() {
    for (const auto& [id, shares] : relayed_) {
      if (!Sends(id, Drop::kBeforeMasking)) continue;
      auto masked = Timed(client_seconds_,
                          [&] { return clients_.at(id)->MaskInput(shares, inputs_.at(id)); });
      if (!masked.ok()) return Refused(id, masked.status());
      masked_[id] = masked->values();
      if (absl::Status s = Timed(server_seconds_, [&] { return server_->AddMaskedInput(*masked); });
          !s.ok()) {
        return s;
      }
    }
    auto requests = Timed(server_seconds_, [&] { return server_->CloseMasking(); });
    if (!requests.ok()) return requests.status();
    requests_ = *std::move(requests);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<uint32_t>> Unmask() {
    for (const auto& [id, request] : requests_) {
      if (!Sends(id, Drop::kBeforeUnmasking)) continue;
      auto response = Timed(client_seconds_, [&] { return clients_.at(id)->Unmask(request); });
      if (!response.ok()) return Refused(id, response.status());
      if (absl::Status s =
              Timed(server_seconds_, [&] { return server_->AddUnmaskResponse(*response); });
          !s.ok()) {
        return s;
      }
    }
    return Timed(server_seconds_, [&] { return server_->CloseUnmasking(); });
  }
  absl::StatusOr<std::vector<uint32_t>> Run() {
    for (auto step : {&Federation::Advertise, &Federation::Share, &Federation::Mask}) {
      if (absl::Status s = (this->*step)(); !s.ok()) return s;
    }
    return Unmask();
  }

  // The ring sum of the inputs of those who sent a masked input.
  std::vector<uint32_t> ExpectedSum() const {
    std::vector<uint32_t> sum(config_.vector_length(), 0);
    for (const auto& [id, input] : inputs_) {
      if (Sends(id, Drop::kBeforeMasking)) {
        EXPECT_TRUE(RingAdd(absl::MakeSpan(sum), input, config_.ring_bits()).ok());
      }
    }
    return sum;
  }
  std::vector<std::string> ExpectedSurvivors() const {
    std::vector<std::string> ids;
    for (const auto& [id, unused] : inputs_) {
      if (Sends(id, Drop::kBeforeMasking)) ids.push_back(id);
    }
    return ids;
  }

  // The masked input `id` sent, as ring values.
  std::vector<uint32_t> masked(const std::string& id) const {
    std::vector<uint32_t> values(config_.vector_length());
    const std::string& bytes = masked_.at(id);
    EXPECT_EQ(bytes.size(), 4 * values.size());
    for (size_t i = 0; i < values.size() && 4 * i + 3 < bytes.size(); ++i) {
      const auto* b = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * i;
      values[i] = b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24;
    }
    return values;
  }
  double client_seconds() const { return client_seconds_; }
  double server_seconds() const { return server_seconds_; }
  SecAggServer& server() { return *server_; }
  std::shared_ptr<const KeySigner> signer(const std::string& id) { return signers_.at(id); }
  std::shared_ptr<const KeyVerifier> verifier() { return verifier_; }
  SecAggClient& client(const std::string& id) { return *clients_.at(id); }
  std::vector<uint32_t>& input(const std::string& id) { return inputs_.at(id); }
  std::map<std::string, v1::KeyBundle>& bundles() { return bundles_; }
  std::map<std::string, v1::EncryptedShares>& relayed() { return relayed_; }
  std::map<std::string, v1::UnmaskRequest>& requests() { return requests_; }

 private:
  static absl::Status Refused(const std::string& id, const absl::Status& status) {
    return absl::InternalError(absl::StrCat("participant ", id, " refused: ", status.message()));
  }

  v1::SecAggConfig config_;
  std::map<std::string, std::shared_ptr<const KeySigner>> signers_;
  std::shared_ptr<const KeyVerifier> verifier_;
  std::unique_ptr<SecAggServer> server_;
  std::map<std::string, std::unique_ptr<SecAggClient>> clients_;
  std::map<std::string, std::vector<uint32_t>> inputs_;
  std::map<std::string, Drop> drops_;
  std::map<std::string, std::string> masked_;  // the masked inputs the server saw, as sent
  std::map<std::string, v1::KeyBundle> bundles_;
  std::map<std::string, v1::EncryptedShares> relayed_;
  std::map<std::string, v1::UnmaskRequest> requests_;
  double client_seconds_ = 0;
  double server_seconds_ = 0;
};

// --- The neighbourhood graph -----------------------------------------------------------------

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
                      Drop::kBeforeUnmasking}) {
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
// spread over the four steps in turn.
TEST(SecAggRoundTest, DropoutsSpreadOverEveryStepGiveTheSurvivorsSum) {
  for (Shape shape : {Shape{10, 9, 5}, Shape{30, 29, 16}}) {
    SCOPED_TRACE(ShapeName(shape));
    Federation f(Config(shape.peers, shape.neighbourhood, shape.threshold, 32, 101));
    const int dropouts = shape.peers - 1 - shape.threshold;
    for (int i = 0; i < dropouts; ++i) f.DropAt(Id(1 + i), static_cast<Drop>(i % 4));
    auto sum = f.Run();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, f.ExpectedSum());
    // Those that dropped out before unmasking sent their masked inputs: they are in the sum.
    EXPECT_EQ(f.server().survivors(), f.ExpectedSurvivors());
    EXPECT_EQ(f.server().survivors().size(),
              static_cast<size_t>(shape.peers - dropouts) + static_cast<size_t>(dropouts / 4));
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

// --- A malicious aggregator ---------------------------------------------------------------------

TEST(SecAggClientTest, RefusesToRevealBothSharesOfOnePeer) {
  Federation f(Config(10, 9, 5, 32, 8));
  f.DropAt(Id(3), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  // The server names peer-5, which sent its masked input, as dropped too, to get the share of
  // its mask key along with the share of its self-mask seed.
  v1::UnmaskRequest request = f.requests().at(Id(0));
  request.add_dropped(Id(5));
  auto response = f.client(Id(0)).Unmask(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(),
              HasSubstr("\"peer-5\" is named both as a survivor and as dropped"));
  // Having refused, the client reveals nothing more, not even for an honest request.
  auto again = f.client(Id(0)).Unmask(f.requests().at(Id(0)));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("earlier refusal"));
}

TEST(SecAggClientTest, RefusesUnmaskRequestsOutsideItsNeighbourhoodOrBelowTheThreshold) {
  Federation f(Config(30, 8, 5, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  auto round = SecAggRound::Create(Config(30, 8, 5, 32, 8));
  ASSERT_TRUE(round.ok());
  std::string stranger;
  for (int i = 1; i < 30 && stranger.empty(); ++i) {
    if (!round->graph().AreNeighbours(Id(0), Id(i))) stranger = Id(i);
  }
  ASSERT_FALSE(stranger.empty());
  v1::UnmaskRequest outside = f.requests().at(Id(0));
  outside.add_dropped(stranger);
  auto refused = f.client(Id(0)).Unmask(outside);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("dropped \"", stranger, "\" is not a neighbour")));

  // Claiming all but threshold - 1 neighbours dropped would unmask too much of one input.
  v1::UnmaskRequest few = f.requests().at(Id(1));
  ASSERT_EQ(few.survivors_size(), 8);
  while (few.survivors_size() > 4) {
    few.add_dropped(few.survivors(few.survivors_size() - 1));
    few.mutable_survivors()->RemoveLast();
  }
  auto below = f.client(Id(1)).Unmask(few);
  EXPECT_EQ(below.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(below.status().message(),
              HasSubstr("4 surviving neighbours, fewer than the threshold 5"));
}

TEST(SecAggClientTest, RefusesASubstitutedKey) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  // The aggregator swaps peer-2's mask key for one it holds the private key of.
  auto own = GenerateX25519KeyPair();
  ASSERT_TRUE(own.ok());
  v1::KeyBundle bundle = f.bundles().at(Id(0));
  bool swapped = false;
  for (v1::AdvertisedKeys& keys : *bundle.mutable_keys()) {
    if (keys.participant_id() == Id(2)) {
      keys.set_mask_public_key(own->public_key);
      swapped = true;
    }
  }
  ASSERT_TRUE(swapped);
  auto shares = f.client(Id(0)).ShareKeys(bundle);
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(shares.status().message(),
              HasSubstr("the keys of \"peer-2\" are refused: the signature of participant "
                        "\"peer-2\" does not verify"));
}

// The signature binds the round: keys advertised for one round are refused in the next, even by
// the same participants under the same identities.
TEST(SecAggClientTest, RefusesKeysAdvertisedForAnotherRound) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  v1::SecAggConfig next = Config(5, 4, 3, 32, 8);
  next.set_round_id("task-7/round-4");
  auto client = SecAggClient::Create(next, Id(0), f.signer(Id(0)), f.verifier());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->AdvertiseKeys().ok());
  auto shares = (*client)->ShareKeys(f.bundles().at(Id(0)));  // round 3's keys
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(shares.status().message(), HasSubstr("the keys of \"peer-1\" are refused"));
}

TEST(SecAggIdentityTest, VerifierNamesWhatIsWrong) {
  EXPECT_THAT(Ed25519KeyVerifier::Create({{"peer-0", "short"}}).status().message(),
              HasSubstr("Ed25519 identity key of \"peer-0\": 5 bytes, expected 32"));
  EXPECT_THAT(Ed25519KeySigner::Create("short").status().message(),
              HasSubstr("Ed25519 identity key: 5 bytes, expected 32"));
  auto identity = GenerateEd25519KeyPair();
  ASSERT_TRUE(identity.ok());
  auto signer = Ed25519KeySigner::Create(identity->private_key);
  auto verifier = Ed25519KeyVerifier::Create({{"peer-0", identity->public_key}});
  ASSERT_TRUE(signer.ok() && verifier.ok());
  auto signature = (*signer)->Sign("message");
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE((*verifier)->Verify("peer-0", "message", *signature).ok());
  EXPECT_EQ((*verifier)->Verify("peer-0", "other message", *signature).code(),
            absl::StatusCode::kUnauthenticated);
  absl::Status unknown = (*verifier)->Verify("peer-1", "message", *signature);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(unknown.message(), HasSubstr("no identity key is known for participant \"peer-1\""));
}

TEST(SecAggServerTest, RefusesKeysNotSignedByTheirParticipant) {
  const v1::SecAggConfig config = Config(5, 4, 3, 32, 8);
  Federation f(config);
  auto keys = f.client(Id(1)).AdvertiseKeys();
  ASSERT_TRUE(keys.ok());
  v1::AdvertisedKeys claimed = *keys;
  claimed.set_participant_id(Id(2));  // peer-1's keys and signature, claimed as peer-2's
  absl::Status s = f.server().AddAdvertisedKeys(claimed);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("participant \"peer-2\" does not verify"));
  v1::AdvertisedKeys short_key = *keys;
  short_key.set_mask_public_key("xyz");
  EXPECT_THAT(f.server().AddAdvertisedKeys(short_key).message(),
              HasSubstr("mask_public_key: 3 bytes, an X25519 key has 32"));
  EXPECT_TRUE(f.server().AddAdvertisedKeys(*keys).ok());
  EXPECT_EQ(f.server().AddAdvertisedKeys(*keys).code(), absl::StatusCode::kAlreadyExists);
}

TEST(SecAggClientTest, RefusesATamperedOrRedirectedShare) {
  for (bool redirect : {false, true}) {
    SCOPED_TRACE(redirect ? "redirected" : "tampered");
    Federation f(Config(5, 4, 3, 32, 8));
    ASSERT_TRUE(f.Advertise().ok());
    ASSERT_TRUE(f.Share().ok());
    v1::EncryptedShares shares = f.relayed().at(Id(0));
    int altered = 0;
    for (v1::EncryptedShare& share : *shares.mutable_shares()) {
      if (share.sender() != Id(1)) continue;
      if (redirect) {
        // The share peer-1 sealed for peer-2, relayed to peer-0 as if it were peer-0's.
        for (const v1::EncryptedShare& other : f.relayed().at(Id(2)).shares()) {
          if (other.sender() == Id(1)) share.set_ciphertext(other.ciphertext());
        }
      } else {
        (*share.mutable_ciphertext())[20] ^= 0x01;
      }
      ++altered;
    }
    ASSERT_EQ(altered, 1);
    auto masked = f.client(Id(0)).MaskInput(shares, f.input(Id(0)));
    EXPECT_EQ(masked.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(masked.status().message(), HasSubstr("the share from \"peer-1\" does not open"));
  }
}

// --- Steps out of order --------------------------------------------------------------------------

TEST(SecAggClientTest, RefusesStepsOutOfOrder) {
  Federation f(Config(5, 4, 3, 32, 8));
  // Asked to unmask before it has even advertised keys: refused, and the round ends for it.
  auto early = f.client(Id(0)).Unmask(v1::UnmaskRequest());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("cannot unmask while advertising keys"));
  EXPECT_THAT(f.client(Id(0)).AdvertiseKeys().status().message(), HasSubstr("earlier refusal"));

  // Masking before sharing, and unmasking twice.
  ASSERT_TRUE(f.client(Id(1)).AdvertiseKeys().ok());
  EXPECT_THAT(f.client(Id(1)).MaskInput(v1::EncryptedShares(), f.input(Id(1))).status().message(),
              HasSubstr("cannot mask the input while sharing keys"));

  Federation g(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(g.Run().ok());
  auto twice = g.client(Id(2)).Unmask(g.requests().at(Id(2)));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("cannot unmask while done"));
}

TEST(SecAggServerTest, RefusesStepsOutOfOrder) {
  Federation f(Config(5, 4, 3, 32, 8));
  auto early = f.server().CloseSharing();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("cannot close sharing while advertising keys"));
  v1::MaskedInput input;
  input.set_participant_id(Id(0));
  EXPECT_THAT(f.server().AddMaskedInput(input).message(),
              HasSubstr("cannot take a masked input while advertising keys"));
  ASSERT_TRUE(f.Advertise().ok());
  v1::AdvertisedKeys late;
  EXPECT_EQ(f.server().AddAdvertisedKeys(late).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SecAggServerTest, RefusesABadMaskedInputAndGoesOnWithoutIt) {
  Federation f(Config(5, 4, 3, 8, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  v1::MaskedInput wrong;
  wrong.set_participant_id(Id(4));
  wrong.set_values(std::string(4 * 7, '\0'));
  EXPECT_THAT(f.server().AddMaskedInput(wrong).message(),
              HasSubstr("28 bytes, expected 32 (8 values)"));
  wrong.set_values(std::string(4 * 8, '\x01'));  // 0x01010101 is outside an 8-bit ring
  EXPECT_THAT(f.server().AddMaskedInput(wrong).message(), HasSubstr("outside the ring"));
  f.DropAt(Id(4), Drop::kBeforeMasking);
  ASSERT_TRUE(f.Mask().ok());
  auto sum = f.Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.ExpectedSum());
}

TEST(SecAggServerTest, RefusesMalformedShareMessages) {
  const v1::SecAggConfig config = Config(10, 4, 3, 32, 8);
  Federation f(config);
  ASSERT_TRUE(f.Advertise().ok());
  auto shares = f.client(Id(0)).ShareKeys(f.bundles().at(Id(0)));
  ASSERT_TRUE(shares.ok()) << shares.status();
  ASSERT_EQ(shares->shares_size(), 4);
  auto round = SecAggRound::Create(config);
  ASSERT_TRUE(round.ok());
  std::string stranger;
  for (int i = 1; i < 10 && stranger.empty(); ++i) {
    if (!round->graph().AreNeighbours(Id(0), Id(i))) stranger = Id(i);
  }
  ASSERT_FALSE(stranger.empty());

  EXPECT_THAT(f.server().AddShares(v1::EncryptedShares()).message(), HasSubstr("holds none"));
  v1::EncryptedShares missing = *shares;
  const std::string last = missing.shares(3).recipient();
  missing.mutable_shares()->RemoveLast();
  EXPECT_THAT(f.server().AddShares(missing).message(),
              HasSubstr(absl::StrCat("no share for neighbour \"", last, "\"")));
  v1::EncryptedShares outside = *shares;
  outside.mutable_shares(0)->set_recipient(stranger);
  EXPECT_THAT(f.server().AddShares(outside).message(),
              HasSubstr(absl::StrCat("recipient \"", stranger, "\" is not a neighbour")));
  v1::EncryptedShares twice = *shares;
  *twice.add_shares() = shares->shares(0);
  EXPECT_THAT(f.server().AddShares(twice).message(), HasSubstr("two shares for"));
  v1::EncryptedShares mixed = *shares;
  mixed.mutable_shares(1)->set_sender(Id(1));
  EXPECT_THAT(f.server().AddShares(mixed).message(), HasSubstr("it holds a share from \"peer-1\""));
  v1::EncryptedShares cut = *shares;
  cut.mutable_shares(2)->set_ciphertext("abc");
  EXPECT_THAT(f.server().AddShares(cut).message(), HasSubstr("too short to be sealed"));
  // None of those counted: the sender's honest message is taken.
  EXPECT_TRUE(f.server().AddShares(*shares).ok());
}

TEST(SecAggServerTest, RefusesAnUnmaskResponseRevealingWhatWasNotAskedFor) {
  Federation f(Config(5, 4, 3, 32, 8));
  ASSERT_TRUE(f.Advertise().ok());
  ASSERT_TRUE(f.Share().ok());
  ASSERT_TRUE(f.Mask().ok());
  auto response = f.client(Id(0)).Unmask(f.requests().at(Id(0)));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->shares(0).owner(), Id(1));
  // A survivor's seed share passed off as a share of its mask key.
  v1::UnmaskResponse swapped = *response;
  const std::string bytes = swapped.shares(0).self_mask_seed_share();
  swapped.mutable_shares(0)->set_mask_key_share(bytes);
  absl::Status s = f.server().AddUnmaskResponse(swapped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a mask key share of \"peer-1\" was not asked for"));
  // Two owners' shares swapped: peer-2 holds share 2 of peer-1's seed and share 3 of peer-3's.
  auto other = f.client(Id(2)).Unmask(f.requests().at(Id(2)));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->shares(1).owner(), Id(1));
  ASSERT_EQ(other->shares(2).owner(), Id(3));
  v1::UnmaskResponse exchanged = *other;
  exchanged.mutable_shares(1)->set_self_mask_seed_share(other->shares(2).self_mask_seed_share());
  exchanged.mutable_shares(2)->set_self_mask_seed_share(other->shares(1).self_mask_seed_share());
  EXPECT_THAT(f.server().AddUnmaskResponse(exchanged).message(),
              HasSubstr("the share of \"peer-1\" has index 3 and size 32; expected index 2"));
  EXPECT_TRUE(f.server().AddUnmaskResponse(*other).ok());
  EXPECT_TRUE(f.server().AddUnmaskResponse(*response).ok());
  EXPECT_EQ(f.server().AddUnmaskResponse(*response).code(), absl::StatusCode::kAlreadyExists);
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
