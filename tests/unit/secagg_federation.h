#pragma once

// The fixture of the SecAgg+ tests (privacy_secagg_test.cc, privacy_secagg_attacks_test.cc,
// privacy_secagg_consistency_test.cc): a
// federation of participants with Ed25519 identities and random inputs, a server, and the honest
// messages of each step, which a test may alter between steps as a malicious aggregator would.

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

namespace shoal::privacy::secagg::fixture {

// When a participant stops sending: never (kNone), or before the step named.
enum class Drop {
  kBeforeAdvertising,
  kBeforeSharing,
  kBeforeMasking,
  kBeforeSigning,
  kBeforeUnmasking,
  kNone
};

inline std::string Id(int i) { return absl::StrCat("peer-", i); }

inline v1::SecAggConfig Config(int n, int k, int t, int bits, uint64_t length) {
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
  // The loops name their entries' parts as references: clang 14 cannot capture a structured
  // binding in a lambda.
  absl::Status Advertise() {
    for (auto& entry : clients_) {
      const std::string& id = entry.first;
      auto& client = entry.second;
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
    for (const auto& entry : bundles_) {
      const auto& id = entry.first;
      const auto& bundle = entry.second;
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
    for (const auto& entry : relayed_) {
      const auto& id = entry.first;
      const auto& shares = entry.second;
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
    auto checks = Timed(server_seconds_, [&] { return server_->CloseMasking(); });
    if (!checks.ok()) return checks.status();
    checks_ = *std::move(checks);
    return absl::OkStatus();
  }
  absl::Status Check() {
    for (const auto& entry : checks_) {
      const auto& id = entry.first;
      const auto& check = entry.second;
      if (!Sends(id, Drop::kBeforeSigning)) continue;
      auto signature =
          Timed(client_seconds_, [&] { return clients_.at(id)->SignSurvivors(check); });
      if (!signature.ok()) return Refused(id, signature.status());
      signatures_[id] = *signature;
      if (absl::Status s =
              Timed(server_seconds_, [&] { return server_->AddSurvivorSignature(*signature); });
          !s.ok()) {
        return s;
      }
    }
    auto requests = Timed(server_seconds_, [&] { return server_->CloseConsistencyCheck(); });
    if (!requests.ok()) return requests.status();
    requests_ = *std::move(requests);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<uint32_t>> Unmask() {
    for (const auto& entry : requests_) {
      const auto& id = entry.first;
      const auto& request = entry.second;
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
    for (auto step :
         {&Federation::Advertise, &Federation::Share, &Federation::Mask, &Federation::Check}) {
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
  std::map<std::string, v1::ConsistencyCheckRequest>& checks() { return checks_; }
  // The survivor-list signatures the participants sent, by signer.
  std::map<std::string, v1::ConsistencyCheckResponse>& signatures() { return signatures_; }
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
  std::map<std::string, v1::ConsistencyCheckRequest> checks_;
  std::map<std::string, v1::ConsistencyCheckResponse> signatures_;
  std::map<std::string, v1::UnmaskRequest> requests_;
  double client_seconds_ = 0;
  double server_seconds_ = 0;
};

}  // namespace shoal::privacy::secagg::fixture
