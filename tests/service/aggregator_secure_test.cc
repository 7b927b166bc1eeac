// Secure aggregation at the aggregator over real gRPC (127.0.0.1:0): peers in threads run
// SecAggClients over SecureAggregate streams; the round publishes base + the survivors' exact
// ring sum / the survivors, bit for bit what the exact sum of the same encodings gives, and
// fails with FAILED_PRECONDITION (publishing nothing) when the dropouts leave fewer than the
// threshold. With peer-level DP the round divides by the expected peers and adds the dropped
// peers' noise shares. A backup's standby takes no stream and, promoted, starts the round again.

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/client.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/privacy/secagg/update_codec.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/aggregator/secure_participant.h"
#include "tests/service/aggregator_service_fixture.h"

namespace shoal::aggregator {
namespace {

namespace secagg = privacy::secagg;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kClipNorm = 1.0;
constexpr size_t kValues = 1000;

// When a test peer stops: never, after it got the others' shares (so it sends no masked
// update), halfway through its masked update (a second chunk naming another peer is refused), or
// after its masked update is in (it does not sign the survivor list, and is not asked to unmask).
enum class Stop { kNever, kBeforeMasking, kMidMasking, kAfterMasking };

struct TestPeer {
  std::string id;
  std::shared_ptr<const secagg::KeySigner> signer;
  std::string identity_public_key;
  std::vector<float> update;
  double noise_stddev =
      0;  // with distributed DP noise: what `update` carries (clamped, not clipped)
  Stop stop = Stop::kNever;
  absl::Status status;                 // how its stream ended (kNever only)
  std::vector<uint32_t> encoded;       // what it masked
  std::vector<std::string> survivors;  // from `done`
  std::vector<std::string> checked;    // the survivor list it was asked to sign
  std::vector<std::string> signers;    // the signatures of the list in its unmask request
};

// Peer-level DP with distributed noise at clip_norm kClipNorm.
common::v1::DpSpec DistributedDp(double noise_multiplier) {
  common::v1::DpSpec dp;
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_noise(common::v1::DP_NOISE_DISTRIBUTED);
  dp.set_clip_norm(kClipNorm);
  dp.set_noise_multiplier(noise_multiplier);
  dp.set_delta(1e-5);
  return dp;
}

tensor::ModelLayout SmallLayout() { return *tensor::ModelLayout::Create({{"w", {kValues}}}); }

class AggregatorSecureTest : public AggregatorServiceFixture {
 protected:
  void MakePeers(int n, uint32_t seed = 7) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> small(-0.01f, 0.01f);
    peers_.clear();
    std::map<std::string, std::string> keys;
    for (int i = 0; i < n; ++i) {
      TestPeer peer;
      peer.id = absl::StrCat("peer-", i);
      auto identity = privacy::GenerateEd25519KeyPair();
      ASSERT_TRUE(identity.ok()) << identity.status();
      peer.identity_public_key = identity->public_key;
      keys[peer.id] = identity->public_key;
      auto signer = secagg::Ed25519KeySigner::Create(identity->private_key);
      ASSERT_TRUE(signer.ok()) << signer.status();
      peer.signer = *std::move(signer);
      peer.update.resize(kValues);
      // peer-0's update is longer than the clip norm (0.1 x sqrt(1000) = 3.2): it is clipped.
      for (float& v : peer.update) v = i == 0 ? 0.1f : small(rng);
      peers_.push_back(std::move(peer));
    }
    auto verifier = secagg::Ed25519KeyVerifier::Create(keys);
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    verifier_ = *std::move(verifier);
  }

  v1::OpenRoundRequest SecureRound(uint64_t round) const {
    v1::OpenRoundRequest request;
    request.set_task("t");
    request.set_round(round);
    request.set_base_version(0);
    v1::SecureAggregationSettings& secure = *request.mutable_secure_aggregation();
    secure.set_enabled(true);
    secure.set_clip_norm(kClipNorm);
    secure.set_step_timeout_ms(20000);
    for (const TestPeer& peer : peers_) {
      request.add_expected_peers(peer.id);
      (*secure.mutable_identity_keys())[peer.id] = peer.identity_public_key;
    }
    return request;
  }

  absl::Status OpenSecure(const v1::OpenRoundRequest& request) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    v1::OpenRoundResponse response;
    return rpc::FromGrpcStatus(stub_->OpenRound(&ctx, request, &response));
  }

  // One peer's whole round on its stream; records how it ended in `peer`.
  void RunPeer(TestPeer& peer, uint64_t round) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    auto stream = stub_->SecureAggregate(&ctx);
    v1::SecureAggregationRequest out;
    v1::SecureAggregationResponse in;
    auto fail = [&](const std::string& what) {
      ctx.TryCancel();
      peer.status = absl::InternalError(absl::StrCat(peer.id, ": ", what));
      stream->Finish();
    };
    v1::SecureAggregationJoin& join = *out.mutable_join();
    join.set_task("t");
    join.set_round(round);
    join.set_peer_id(peer.id);
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_start()) return fail("no start");
    const privacy::v1::SecAggConfig config = in.start().config();
    auto codec = secagg::UpdateCodec(in.start().clip_norm(), config.participant_ids_size(),
                                     peer.noise_stddev);
    auto client = secagg::SecAggClient::Create(config, peer.id, peer.signer, verifier_);
    if (!codec.ok() || !client.ok()) return fail("bad start");
    auto keys = (*client)->AdvertiseKeys();
    *out.mutable_keys() = *keys;
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_key_bundle()) return fail("keys");
    auto shares = (*client)->ShareKeys(in.key_bundle());
    if (!shares.ok()) return fail(std::string(shares.status().message()));
    *out.mutable_shares() = *shares;
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_shares()) return fail("shares");
    if (peer.stop == Stop::kBeforeMasking) {
      ctx.TryCancel();
      stream->Finish();
      return;
    }
    auto encoded = peer.noise_stddev > 0 ? secagg::ClampAndEncode(*codec, peer.update)
                                         : secagg::ClipAndEncode(*codec, peer.update);
    if (!encoded.ok()) return fail(std::string(encoded.status().message()));
    peer.encoded = *encoded;
    auto masked = (*client)->MaskInput(in.shares(), *encoded);
    if (!masked.ok()) return fail(std::string(masked.status().message()));
    *out.mutable_masked()->mutable_input() = *masked;
    out.mutable_masked()->set_num_samples(10);
    out.mutable_masked()->set_train_loss(0.5);
    if (peer.stop == Stop::kMidMasking) {  // `status`: how the aggregator ended its stream
      privacy::v1::MaskedInput& input = *out.mutable_masked()->mutable_input();
      input.set_values(masked->values().substr(0, masked->values().size() / 2));
      stream->Write(out);
      input.set_participant_id("peer-0");
      stream->Write(out);
      while (stream->Read(&in)) {
      }
      peer.status = rpc::FromGrpcStatus(stream->Finish());
      return;
    }
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_consistency()) return fail("masked");
    peer.checked.assign(in.consistency().survivors().begin(), in.consistency().survivors().end());
    if (peer.stop == Stop::kAfterMasking) {
      ctx.TryCancel();
      stream->Finish();
      return;
    }
    auto signature = (*client)->SignSurvivors(in.consistency());
    if (!signature.ok()) return fail(std::string(signature.status().message()));
    *out.mutable_consistency() = *signature;
    if (!stream->Write(out) || !stream->Read(&in)) {
      peer.status = rpc::FromGrpcStatus(stream->Finish());  // how the aggregator ended it
      return;
    }
    if (!in.has_unmask()) return fail("consistency");
    for (const auto& signed_by : in.unmask().survivor_signatures()) {
      peer.signers.push_back(signed_by.participant_id());
    }
    auto unmask = (*client)->Unmask(in.unmask());
    if (!unmask.ok()) return fail(std::string(unmask.status().message()));
    *out.mutable_unmask() = *unmask;
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_done()) return fail("unmask");
    peer.survivors.assign(in.done().survivors().begin(), in.done().survivors().end());
    stream->WritesDone();
    while (stream->Read(&in)) {
    }
    peer.status = rpc::FromGrpcStatus(stream->Finish());
  }

  void RunAll(uint64_t round) {
    std::vector<std::thread> threads;
    for (TestPeer& peer : peers_)
      threads.emplace_back([this, &peer, round] { RunPeer(peer, round); });
    for (std::thread& t : threads) t.join();
  }

  // base + the exact ring sum of the survivors' encodings / survivors, as the round computes it.
  std::vector<float> Expected(const std::vector<std::string>& survivors,
                              const tensor::FlatModel& base) {
    const size_t values = base.values.size();
    std::vector<uint32_t> sum(values, 0);
    for (const TestPeer& peer : peers_) {
      if (std::find(survivors.begin(), survivors.end(), peer.id) == survivors.end()) continue;
      EXPECT_TRUE(privacy::RingAdd(absl::MakeSpan(sum), peer.encoded, 32).ok());
    }
    auto codec = secagg::UpdateCodec(kClipNorm, static_cast<int>(peers_.size()), 0);
    auto mean =
        secagg::ApplyMeanOfSum(*codec, sum, static_cast<int>(survivors.size()), base.values);
    EXPECT_TRUE(mean.ok()) << mean.status();
    // Within a quantum of the float mean of the clipped updates.
    std::vector<double> scale;  // each peer's clipping factor
    for (const TestPeer& peer : peers_) {
      double norm = 0;
      for (float v : peer.update) norm += static_cast<double>(v) * v;
      norm = std::sqrt(norm);
      scale.push_back(norm > kClipNorm ? kClipNorm / norm : 1.0);
    }
    for (size_t i = 0; mean.ok() && i < values; i += 97) {
      double float_mean = 0;
      for (size_t p = 0; p < peers_.size(); ++p) {
        const TestPeer& peer = peers_[p];
        if (std::find(survivors.begin(), survivors.end(), peer.id) == survivors.end()) continue;
        float_mean += peer.update[i] * scale[p];
      }
      float_mean /= static_cast<double>(survivors.size());
      EXPECT_NEAR((*mean)[i], base.values[i] + float_mean, codec->quantum() + 1e-6) << i;
    }
    return mean.ok() ? *mean : std::vector<float>();
  }

  // Every peer's round through GrpcAggregatorClient::SecureAggregate and a SecureParticipant (5
  // samples each); each must end OK with every peer a survivor. Records what each encoded.
  void RunAllThroughClient(uint64_t round) {
    std::map<std::string, std::string> keys;
    for (const TestPeer& peer : peers_) keys[peer.id] = peer.identity_public_key;
    GrpcAggregatorClient client;
    std::vector<absl::Status> results(peers_.size());
    std::vector<std::vector<std::string>> survivors(peers_.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < peers_.size(); ++i) {
      threads.emplace_back([&, i] {
        SecureContribution c;
        c.peer_id = peers_[i].id;
        c.signer = peers_[i].signer;
        c.identity_keys = keys;
        c.update = peers_[i].update;
        c.num_samples = 5;
        SecureParticipant party(std::move(c));
        results[i] =
            client.SecureAggregate(server_->address(), "t", round, Caller{peers_[i].id, ""}, party,
                                   absl::Now() + absl::Seconds(60));
        survivors[i] = party.survivors();
        auto codec = secagg::UpdateCodec(kClipNorm, static_cast<int>(peers_.size()), 0);
        peers_[i].encoded = *secagg::ClipAndEncode(*codec, peers_[i].update);
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<std::string> everyone;
    for (const TestPeer& peer : peers_) everyone.push_back(peer.id);
    for (size_t i = 0; i < peers_.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << results[i];
      EXPECT_EQ(survivors[i], everyone);
    }
  }

  void PutBase() {
    base_ = Filled([](size_t i) { return 0.001f * static_cast<float>(i % 17); }, SmallLayout());
    ASSERT_TRUE(Put("t", 0, base_).ok());
  }

  // The decoded ring sum of the survivors' encodings, at the round's codec.
  std::vector<double> DecodedSum(const std::vector<std::string>& survivors, size_t values,
                                 double noise_stddev) {
    std::vector<uint32_t> sum(values, 0);
    for (const TestPeer& peer : peers_) {
      if (std::find(survivors.begin(), survivors.end(), peer.id) == survivors.end()) continue;
      EXPECT_TRUE(privacy::RingAdd(absl::MakeSpan(sum), peer.encoded, 32).ok());
    }
    auto codec = secagg::UpdateCodec(kClipNorm, static_cast<int>(peers_.size()), noise_stddev);
    auto decoded = codec->DecodeSum(sum, static_cast<int>(survivors.size()));
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.ok() ? *decoded : std::vector<double>(values, 0.0);
  }

  std::vector<TestPeer> peers_;
  std::shared_ptr<const secagg::KeyVerifier> verifier_;
  tensor::FlatModel base_;
};

TEST_F(AggregatorSecureTest, PublishesTheExactSumOfEveryPeer) {
  PutBase();
  MakePeers(5);
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  for (const TestPeer& peer : peers_) EXPECT_TRUE(peer.status.ok()) << peer.status;
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version(), 1u);
  EXPECT_EQ(closed->contributors_size(), 5);
  EXPECT_EQ(closed->num_samples(), 50u);
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values,
            Expected({"peer-0", "peer-1", "peer-2", "peer-3", "peer-4"}, base_));
  // A repeated CloseRound answers the same.
  auto again = Close("t", 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->digest_xxh3(), closed->digest_xxh3());
}

TEST_F(AggregatorSecureTest, DropoutsBeforeAndAfterMaskingStillPublishTheSurvivorsSum) {
  PutBase();
  // Threshold 3 of 5 neighbours: each survivor keeps 3 neighbours that answer the unmask request.
  MakePeers(6);
  peers_[3].stop = Stop::kBeforeMasking;  // its pairwise masks are removed; not in the sum
  peers_[4].stop = Stop::kAfterMasking;   // in the sum, unsigned; the others remove its self mask
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  EXPECT_THAT(peers_[4].checked, ElementsAre("peer-0", "peer-1", "peer-2", "peer-4", "peer-5"));
  for (int i : {0, 1, 2, 5}) {
    EXPECT_TRUE(peers_[i].status.ok()) << peers_[i].status;
    // Every survivor was sent the same list to sign; the unmask request carries the signatures
    // of those that signed it.
    EXPECT_EQ(peers_[i].checked, peers_[4].checked);
    EXPECT_THAT(peers_[i].signers, ElementsAre("peer-0", "peer-1", "peer-2", "peer-5"));
    EXPECT_THAT(peers_[i].survivors, ElementsAre("peer-0", "peer-1", "peer-2", "peer-4", "peer-5"));
  }
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors(),
              ElementsAre("peer-0", "peer-1", "peer-2", "peer-4", "peer-5"));
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values,
            Expected({"peer-0", "peer-1", "peer-2", "peer-4", "peer-5"}, base_));
}

// peer-3's first chunk is folded into the sum, its second refused: it is out of the round, and
// the published model is the exact mean of the others' updates.
TEST_F(AggregatorSecureTest, APeerDroppedMidUpdateLeavesNothingInTheSum) {
  PutBase();
  MakePeers(6);
  peers_[3].stop = Stop::kMidMasking;
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  EXPECT_EQ(peers_[3].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(peers_[3].status.message(), HasSubstr("names participant 'peer-0'"));
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors(),
              ElementsAre("peer-0", "peer-1", "peer-2", "peer-4", "peer-5"));
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values,
            Expected({"peer-0", "peer-1", "peer-2", "peer-4", "peer-5"}, base_));
}

TEST_F(AggregatorSecureTest, TooManyDropoutsFailTheRoundWhichRunsAgain) {
  PutBase();
  MakePeers(5);
  // Threshold 3 of 4 neighbours: two survivors cannot be unmasked.
  for (int i = 2; i < 5; ++i) peers_[i].stop = Stop::kBeforeMasking;
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  auto closed = Close("t", 1);
  ASSERT_FALSE(closed.ok());
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition) << closed.status();
  EXPECT_THAT(closed.status().message(), HasSubstr("nothing is published"));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(peers_[i].status.code(), absl::StatusCode::kInternal) << peers_[i].status;
  }
  auto latest = Get("t");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.version(), 0u);
  // The same round opened again runs again, with everyone this time.
  for (TestPeer& peer : peers_) {
    peer.stop = Stop::kNever;
    peer.status = absl::OkStatus();
  }
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  auto rerun = Close("t", 1);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->version(), 1u);
  EXPECT_EQ(rerun->contributors_size(), 5);
}

// Replicas: a backup's standby round holds the base version and takes no stream (UNAVAILABLE:
// the peer tries its primary, or this one later). Promoted (opened again without standby_for),
// it starts the secure round from its first step, counted, and publishes the exact sum.
TEST_F(AggregatorSecureTest, APromotedStandbyStartsTheSecureRoundAgain) {
  PutBase();
  MakePeers(3);
  v1::OpenRoundRequest standby = SecureRound(1);
  standby.set_standby_for("cluster-a");
  ASSERT_TRUE(OpenSecure(standby).ok());
  ASSERT_TRUE(OpenSecure(standby).ok()) << "a repeated standby open";
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    auto stream = stub_->SecureAggregate(&ctx);
    v1::SecureAggregationRequest join;
    join.mutable_join()->set_task("t");
    join.mutable_join()->set_round(1);
    join.mutable_join()->set_peer_id("peer-0");
    stream->Write(join);
    v1::SecureAggregationResponse in;
    EXPECT_FALSE(stream->Read(&in));
    const absl::Status refused = rpc::FromGrpcStatus(stream->Finish());
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("standby backup"));
  }
  EXPECT_EQ(Close("t", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::OpenRoundRequest primary_only = SecureRound(1);
  primary_only.add_backups("backup-b");
  EXPECT_THAT(OpenSecure(primary_only).message(), HasSubstr("copies nothing"));
  EXPECT_EQ(Metric("shoal_aggregator_secure_restarts_total"), 0);
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());  // promoted
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok()) << "a repeated open goes on with the same run";
  EXPECT_EQ(OpenSecure(standby).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Metric("shoal_aggregator_secure_restarts_total"), 1);
  RunAll(1);
  for (const TestPeer& peer : peers_) EXPECT_TRUE(peer.status.ok()) << peer.status;
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->contributors_size(), 3);
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values, Expected({"peer-0", "peer-1", "peer-2"}, base_));
}

// Three of five survivors do not sign the survivor list: two signatures, under the threshold 3,
// fail the round at the consistency check, before anyone is asked to unmask.
TEST_F(AggregatorSecureTest, TooFewSignaturesOfTheSurvivorListFailTheRound) {
  PutBase();
  MakePeers(5);
  for (int i = 2; i < 5; ++i) peers_[i].stop = Stop::kAfterMasking;
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAll(1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(peers_[i].status.code(), absl::StatusCode::kFailedPrecondition) << peers_[i].status;
    EXPECT_THAT(peers_[i].status.message(),
                HasSubstr("consistency check: 2 of the 5 survivors signed the survivor list, "
                          "fewer than the threshold 3"));
    EXPECT_TRUE(peers_[i].signers.empty());
  }
  auto closed = Close("t", 1);
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition) << closed.status();
  EXPECT_THAT(closed.status().message(), HasSubstr("nothing is published"));
  EXPECT_THAT(closed.status().message(), HasSubstr("consistency check"));
  auto latest = Get("t");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->meta.version(), 0u);
}

TEST_F(AggregatorSecureTest, RefusesWhatSecureAggregationCannotDo) {
  PutBase();
  MakePeers(3);
  v1::OpenRoundRequest median = SecureRound(1);
  median.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEDIAN);
  absl::Status refused = OpenSecure(median);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("aggregation median must see each update"));
  v1::OpenRoundRequest missing_key = SecureRound(1);
  missing_key.mutable_secure_aggregation()->mutable_identity_keys()->erase("peer-2");
  refused = OpenSecure(missing_key);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("secure_aggregation.identity_keys"));
  v1::OpenRoundRequest other_clip = SecureRound(1);
  *other_clip.mutable_dp() = DistributedDp(1);
  other_clip.mutable_dp()->set_clip_norm(2 * kClipNorm);
  refused = OpenSecure(other_clip);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("differs from dp.clip_norm"));
  // A plain push into a secure round is refused.
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  auto pushed = Push(Meta("peer-0", 10), Filled([](size_t) { return 0.f; }, SmallLayout()));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pushed.status().message(), HasSubstr("SecureAggregate"));
}

TEST_F(AggregatorSecureTest, WithDpTheRoundDividesByTheExpectedPeers) {
  PutBase();
  MakePeers(5);
  peers_[3].stop = Stop::kBeforeMasking;
  // Noise multiplier 0: no noise anywhere, so the fixed denominator shows exactly.
  v1::OpenRoundRequest request = SecureRound(1);
  *request.mutable_dp() = DistributedDp(0);
  ASSERT_TRUE(OpenSecure(request).ok());
  RunAll(1);
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  const std::vector<std::string> survivors = {"peer-0", "peer-1", "peer-2", "peer-4"};
  EXPECT_THAT(closed->contributors(), ElementsAre("peer-0", "peer-1", "peer-2", "peer-4"));
  const std::vector<double> sum = DecodedSum(survivors, kValues, 0);
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  for (size_t i = 0; i < kValues; ++i) {
    // Over the 5 expected peers, not the 4 survivors.
    ASSERT_EQ(published->model.values[i], static_cast<float>(base_.values[i] + sum[i] / 5)) << i;
  }
}

TEST_F(AggregatorSecureTest, WithDistributedNoiseTheAggregatorAddsTheDroppedPeersShare) {
  constexpr size_t kNoisyValues = 20000;
  ASSERT_TRUE(
      Put("t", 0,
          Filled([](size_t) { return 0.f; }, *tensor::ModelLayout::Create({{"w", {kNoisyValues}}})))
          .ok());
  MakePeers(4);
  // Noise multiplier 2 over 4 peers: each update carries N(0, (2 x 1)^2 / 4), sd 1 (and nothing
  // else, so the sum is all noise).
  std::mt19937 rng(11);
  std::normal_distribution<float> share(0.f, 1.f);
  for (TestPeer& peer : peers_) {
    peer.noise_stddev = 1.0;
    peer.update.resize(kNoisyValues);
    for (float& v : peer.update) v = share(rng);
  }
  peers_[3].stop = Stop::kBeforeMasking;
  v1::OpenRoundRequest request = SecureRound(1);
  *request.mutable_dp() = DistributedDp(2);
  ASSERT_TRUE(OpenSecure(request).ok());
  RunAll(1);
  ASSERT_TRUE(Close("t", 1).ok());
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  const std::vector<double> sum = DecodedSum({"peer-0", "peer-1", "peer-2"}, kNoisyValues, 1.0);
  // What the aggregator added: published x 4 - the survivors' sum, the dropped peer's share
  // N(0, 1); over 4: sd 0.25. Standard error with 20 000 values: 0.0013.
  double sq = 0;
  for (size_t i = 0; i < kNoisyValues; ++i) {
    const double added = published->model.values[i] - sum[i] / 4;
    sq += added * added;
  }
  EXPECT_NEAR(std::sqrt(sq / kNoisyValues), 0.25, 0.015);
}

// The peers' production side: GrpcAggregatorClient::SecureAggregate with SecureParticipant,
// checking the aggregator's round against the coordinator's identity keys.
TEST_F(AggregatorSecureTest, PeersThroughTheClientAndSecureParticipant) {
  PutBase();
  MakePeers(3);
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAllThroughClient(1);
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->num_samples(), 15u);
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values, Expected({"peer-0", "peer-1", "peer-2"}, base_));
}

// A model of 2,500,000 values: each masked update (10 MB) goes in three chunks, more than one
// message may carry, and the round still publishes the exact sum.
TEST_F(AggregatorSecureTest, AModelPastOneMessageTravelsInChunks) {
  constexpr size_t kBigValues = 2500000;
  base_ = Filled([](size_t i) { return 0.001f * static_cast<float>(i % 13); },
                 *tensor::ModelLayout::Create({{"w", {kBigValues}}}));
  ASSERT_TRUE(Put("t", 0, base_).ok());
  MakePeers(3);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> tiny(-0.0005f, 0.0005f);
  for (TestPeer& peer : peers_) {
    peer.update.resize(kBigValues);
    for (float& v : peer.update) v = tiny(rng);
  }
  ASSERT_TRUE(OpenSecure(SecureRound(1)).ok());
  RunAllThroughClient(1);
  auto closed = Close("t", 1);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->contributors_size(), 3);
  auto published = Get("t", 1);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->model.values, Expected({"peer-0", "peer-1", "peer-2"}, base_));
}

TEST_F(AggregatorSecureTest, AParticipantRefusesARoundThatIsNotTheCoordinators) {
  MakePeers(3);
  privacy::v1::SecAggConfig config;
  config.set_round_id("t/round-1/base-0");
  for (const char* id : {"peer-0", "peer-1", "intruder"}) config.add_participant_ids(id);
  config.set_threshold(2);
  config.set_neighbourhood_size(2);
  config.set_ring_bits(32);
  config.set_vector_length(kValues);
  v1::SecureAggregationResponse start;
  *start.mutable_start()->mutable_config() = config;
  start.mutable_start()->set_clip_norm(kClipNorm);
  SecureContribution c;
  c.peer_id = "peer-0";
  c.signer = peers_[0].signer;
  for (const TestPeer& peer : peers_) c.identity_keys[peer.id] = peer.identity_public_key;
  c.update = peers_[0].update;
  SecureParticipant party(std::move(c));
  auto answer = party.Answer(start);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(answer.status().message(), HasSubstr("participants are not the coordinator's"));
}

}  // namespace
}  // namespace shoal::aggregator
