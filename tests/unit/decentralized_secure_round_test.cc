// The decentralized peer's secure round (services/peer_agent/modes/decentralized/secure_round.h):
// participants that mask over the coordinator's PeerList, hold each other's served updates and
// reveal for the survivors end with the same bits: base + the mean of the survivors' clipped
// deltas, whichever participant dropped after masking.

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/dp_update.h"
#include "libs/privacy/secagg/identity.h"
#include "services/peer_agent/modes/decentralized/secure_round.h"
#include "services/peer_agent/update_privacy.h"

namespace shoal::peer {
namespace {

using ::testing::HasSubstr;

constexpr int kPeers = 4;

tensor::FlatModel Model(std::vector<float> values) {
  tensor::FlatModel m;
  m.layout =
      *tensor::ModelLayout::Create({{"w", {static_cast<int64_t>(values.size() - 3)}}, {"b", {3}}});
  m.values = std::move(values);
  return m;
}

struct Participants {
  tensor::FlatModel base;
  std::vector<tensor::FlatModel> trained;
  std::vector<std::unique_ptr<privacy::secagg::Ed25519KeySigner>> signers;
  std::vector<SecureRound> rounds;
  std::vector<coordinator::v1::PeerEndpoint> list;
};

Participants Make(double clip_norm) {
  Participants p;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> base(203);
  for (float& x : base) x = normal(rng);
  p.base = Model(base);
  for (int i = 0; i < kPeers; ++i) {
    const std::string id = "peer-" + std::to_string(i);
    std::vector<float> trained = base;
    for (float& x : trained) x += normal(rng);
    p.trained.push_back(Model(trained));
    privacy::KeyPair identity = *privacy::GenerateEd25519KeyPair();
    p.signers.push_back(*privacy::secagg::Ed25519KeySigner::Create(identity.private_key));
    auto round = SecureRound::Start("task", 1, id, clip_norm, 100 + i, p.base, p.trained.back());
    EXPECT_TRUE(round.ok()) << round.status();
    p.rounds.push_back(*std::move(round));
    privacy::secagg::MaskKey key = *p.rounds.back().Advertise(*p.signers.back());
    coordinator::v1::PeerEndpoint e;
    e.set_peer_id(id);
    e.set_identity_public_key(identity.public_key);
    e.set_mask_public_key(key.public_key);
    e.set_mask_key_signature(key.signature);
    p.list.push_back(e);
  }
  return p;
}

// Every participant masks over the list, holds the others' masked updates, reveals for
// `survivors`; every survivor finishes. Returns the survivors' results.
// With `noises` (one per participant) each masks with its noise.
std::vector<SecureRound::Result> RunRound(Participants& p, const std::vector<int>& survivors,
                                          std::vector<UpdatePrivacy>* noises = nullptr) {
  std::vector<std::shared_ptr<const tensor::FlatModel>> served;
  for (int i = 0; i < kPeers; ++i) {
    auto s = p.rounds[i].Mask(1, p.list, noises != nullptr ? &(*noises)[i] : nullptr);
    EXPECT_TRUE(s.ok()) << s.status();
    served.push_back(*s);
    EXPECT_EQ(served.back()->layout, SecureRound::MaskedLayout(203));
  }
  coordinator::v1::Unmask unmask;
  unmask.set_round(1);
  unmask.set_attempt(2);  // a later PeerList (sharing) than the masking's
  for (int i : survivors) unmask.add_survivors("peer-" + std::to_string(i));
  coordinator::v1::MaskReveals reveals;
  for (int i : survivors) {
    for (int j = 0; j < kPeers; ++j) {
      if (j != i) {
        EXPECT_TRUE(p.rounds[i].Hold("peer-" + std::to_string(j), *served[j], 100 + j).ok());
      }
    }
    auto seeds = p.rounds[i].Reveal(unmask);
    EXPECT_TRUE(seeds.ok()) << seeds.status();
    (*reveals.mutable_seeds())["peer-" + std::to_string(i)] = *seeds;
  }
  std::vector<SecureRound::Result> results;
  for (int i : survivors) {
    auto r = p.rounds[i].Finish(reveals, p.base);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) results.push_back(*std::move(r));
  }
  return results;
}

TEST(DecentralizedSecureRoundTest, SurvivorsEndWithTheSameMeanOfTheirUpdates) {
  for (const std::vector<int>& survivors :
       std::vector<std::vector<int>>{{0, 1, 2, 3}, {0, 1, 3}, {1, 2, 3}}) {
    SCOPED_TRACE(testing::PrintToString(survivors));
    Participants p = Make(100.0);  // large enough: nothing is clipped
    std::vector<SecureRound::Result> results = RunRound(p, survivors);
    ASSERT_EQ(results.size(), survivors.size());
    uint64_t samples = 0;
    for (int i : survivors) samples += 100 + i;
    for (const SecureRound::Result& r : results) {
      EXPECT_EQ(r.model.Digest(), results[0].model.Digest());
      EXPECT_EQ(r.num_samples, samples);
      EXPECT_EQ(r.survivors.size(), survivors.size());
    }
    for (size_t k = 0; k < p.base.values.size(); ++k) {
      double mean = 0;
      for (int i : survivors) mean += p.trained[i].values[k] - p.base.values[k];
      mean /= static_cast<double>(survivors.size());
      EXPECT_NEAR(results[0].model.values[k], p.base.values[k] + mean, 1e-5) << k;
    }
  }
}

// privacy.dp at level peer, noise distributed: each masked update carries N(0, (σC)² / 4), so
// the survivors' mean is off the clipped mean by N(0, (σC / 4)²) per value, the same bits at
// every survivor.
TEST(DecentralizedSecureRoundTest, TheMeanCarriesTheSumOfTheNoiseShares) {
  constexpr double kSigma = 2, kClip = 1;
  common::v1::TaskSpec spec;
  common::v1::DpSpec& dp = *spec.mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(common::v1::DP_NOISE_DISTRIBUTED);
  dp.set_noise_multiplier(kSigma);
  dp.set_clip_norm(kClip);
  std::vector<double> off;
  for (uint64_t seed = 0; seed < 10; ++seed) {  // 10 rounds of 203 values
    Participants p = Make(kClip);
    std::vector<UpdatePrivacy> noises;
    for (int i = 0; i < kPeers; ++i)
      noises.push_back(UpdatePrivacy::WithSeed(spec, CentralNoise::kAtPeer, seed * 16 + i));
    std::vector<SecureRound::Result> results = RunRound(p, {0, 1, 2, 3}, &noises);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_EQ(results[3].model.Digest(), results[0].model.Digest());
    for (size_t k = 0; k < p.base.values.size(); ++k) {
      double mean = 0;
      for (int i = 0; i < kPeers; ++i) {
        std::vector<float> d(p.base.values.size());
        for (size_t j = 0; j < d.size(); ++j) d[j] = p.trained[i].values[j] - p.base.values[j];
        privacy::ClipToNorm(absl::MakeSpan(d), kClip);
        mean += d[k];
      }
      off.push_back(results[0].model.values[k] - p.base.values[k] - mean / kPeers);
    }
  }
  double sum = 0, squares = 0;
  for (double x : off) sum += x;
  const double mean = sum / static_cast<double>(off.size());
  for (double x : off) squares += (x - mean) * (x - mean);
  const double stddev = std::sqrt(squares / static_cast<double>(off.size() - 1));
  // 2030 values: the stddev's own error is about 1.6%.
  EXPECT_NEAR(stddev, kSigma * kClip / kPeers, 0.08 * kSigma * kClip / kPeers);
  EXPECT_NEAR(mean, 0, 4 * kSigma * kClip / kPeers / std::sqrt(2030.0));
}

TEST(DecentralizedSecureRoundTest, RefusesWhatDoesNotFit) {
  Participants p = Make(1.0);
  // A list without keys (a coordinator without secure aggregation).
  std::vector<coordinator::v1::PeerEndpoint> bare = p.list;
  bare[2].clear_mask_public_key();
  EXPECT_THAT(p.rounds[0].Mask(1, bare).status().message(),
              HasSubstr("gives participant peer-2 no identity or mask key"));
  auto served = p.rounds[1].Mask(1, p.list);
  ASSERT_TRUE(served.ok());
  ASSERT_TRUE(p.rounds[0].Mask(1, p.list).ok());
  // A served update of float32 values, or of another size, is not a masked update.
  tensor::FlatModel floats = **served;
  floats.layout = *tensor::ModelLayout::Create(
      {tensor::TensorSpec{"masked_update", {static_cast<int64_t>(floats.values.size())}}});
  EXPECT_THAT(p.rounds[0].Hold("peer-1", floats, 1).message(), HasSubstr("uint32"));
  EXPECT_THAT(p.rounds[0].Hold("peer-1", p.base, 1).message(), HasSubstr("expected"));
  EXPECT_THAT(p.rounds[0].Hold("peer-9", **served, 1).message(), HasSubstr("did not mask with"));
  // Told it is not a survivor: it reveals nothing.
  coordinator::v1::Unmask unmask;
  unmask.set_round(1);
  unmask.set_attempt(1);
  for (const char* id : {"peer-1", "peer-2", "peer-3"}) unmask.add_survivors(id);
  EXPECT_EQ(p.rounds[0].Reveal(unmask).status().code(), absl::StatusCode::kFailedPrecondition);
  coordinator::v1::MaskReveals reveals;
  EXPECT_EQ(p.rounds[0].Finish(reveals, p.base).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shoal::peer
