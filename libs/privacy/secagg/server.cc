#include "libs/privacy/secagg/server.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/wire.h"

namespace shoal::privacy::secagg {
namespace {

const char* ServerStepName(int step) {
  static const char* const kNames[] = {"advertising keys",     "sharing keys", "masking",
                                       "checking consistency", "unmasking",    "done"};
  return step >= 0 && step < 6 ? kNames[step] : "failed";
}

absl::Status Invalid(absl::string_view participant, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("secagg: the message of \"", participant, "\" is refused: ", what));
}

// The ids a map is keyed by.
template <typename Map>
std::set<std::string, std::less<>> KeysOf(const Map& map) {
  std::set<std::string, std::less<>> ids;
  for (const auto& [id, unused] : map) ids.insert(id);
  return ids;
}

MaskSign Opposite(MaskSign sign) {
  return sign == MaskSign::kAdd ? MaskSign::kSubtract : MaskSign::kAdd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SecAggServer>> SecAggServer::Create(
    const v1::SecAggConfig& config, std::shared_ptr<const KeyVerifier> verifier,
    std::vector<uint32_t> sum_buffer) {
  SHOAL_ASSIGN_OR_RETURN(SecAggRound round, SecAggRound::Create(config));
  if (verifier == nullptr) return absl::InvalidArgumentError("secagg server: no key verifier");
  return std::unique_ptr<SecAggServer>(
      new SecAggServer(std::move(round), std::move(verifier), std::move(sum_buffer)));
}

SecAggServer::SecAggServer(SecAggRound round, std::shared_ptr<const KeyVerifier> verifier,
                           std::vector<uint32_t> sum_buffer)
    : round_(std::move(round)), verifier_(std::move(verifier)), sum_(std::move(sum_buffer)) {
  sum_.clear();  // the memory stays; CloseSharing sizes it and sets it to zero
}

absl::Status SecAggServer::Expect(Step step, absl::string_view what) const {
  if (step_ == Step::kFailed) return failure_;
  if (step_ != step) {
    return absl::FailedPreconditionError(absl::StrCat("secagg server: cannot ", what, " while ",
                                                      ServerStepName(static_cast<int>(step_))));
  }
  return absl::OkStatus();
}

absl::Status SecAggServer::Fail(absl::Status error) {
  step_ = Step::kFailed;
  failure_ = absl::Status(
      error.code(), absl::StrCat("secagg round ", round_.round_id(), " failed: ", error.message()));
  sum_.clear();
  partial_.clear();
  return failure_;
}

absl::Status SecAggServer::CheckNeighbourhoods(const IdSet& members, const IdSet& live,
                                               absl::string_view stage) const {
  if (live.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no participant is left after ", stage));
  }
  for (const std::string& id : members) {
    std::vector<std::string> missing;
    int present = 0;
    for (const std::string& neighbour : round_.graph().Neighbours(id)) {
      if (live.contains(neighbour)) {
        ++present;
      } else {
        missing.push_back(neighbour);
      }
    }
    if (present < round_.threshold()) {
      return absl::FailedPreconditionError(
          absl::StrCat("after ", stage, ", \"", id, "\" has ", present,
                       " neighbours left, fewer than the "
                       "threshold ",
                       round_.threshold(), " (missing: ", absl::StrJoin(missing, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

uint32_t SecAggServer::ShareIndex(absl::string_view owner, absl::string_view holder) const {
  uint32_t index = 0;
  for (const std::string& neighbour : round_.graph().Neighbours(owner)) {
    if (keys_.contains(neighbour)) ++index;
    if (neighbour == holder) return index;
  }
  return 0;  // not a holder: no share has index 0
}

// --- Step 1 ---------------------------------------------------------------------------------

absl::Status SecAggServer::AddAdvertisedKeys(const v1::AdvertisedKeys& keys) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kAdvertising, "take advertised keys"));
  const std::string& id = keys.participant_id();
  if (!round_.graph().Contains(id)) return Invalid(id, "not a participant of this round");
  if (keys_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("secagg: \"", id, "\" already advertised keys"));
  }
  if (absl::Status s = CheckPublicKey("encryption_public_key", keys.encryption_public_key());
      !s.ok()) {
    return Invalid(id, s.message());
  }
  if (absl::Status s = CheckPublicKey("mask_public_key", keys.mask_public_key()); !s.ok()) {
    return Invalid(id, s.message());
  }
  SHOAL_RETURN_IF_ERROR(
      verifier_->Verify(id,
                        SignedKeysMessage(round_.round_id(), id, keys.encryption_public_key(),
                                          keys.mask_public_key()),
                        keys.signature()));
  keys_.emplace(id, keys);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, v1::KeyBundle>> SecAggServer::CloseAdvertising() {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kAdvertising, "close advertising"));
  const IdSet advertised = KeysOf(keys_);
  if (absl::Status s = CheckNeighbourhoods(advertised, advertised, "advertising keys"); !s.ok()) {
    return Fail(s);
  }
  std::map<std::string, v1::KeyBundle> bundles;
  for (const std::string& id : advertised) {
    v1::KeyBundle& bundle = bundles[id];
    for (const std::string& neighbour : round_.graph().Neighbours(id)) {
      auto it = keys_.find(neighbour);
      if (it != keys_.end()) *bundle.add_keys() = it->second;
    }
  }
  step_ = Step::kSharing;
  return bundles;
}

// --- Step 2 ---------------------------------------------------------------------------------

absl::Status SecAggServer::AddShares(const v1::EncryptedShares& shares) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kSharing, "take shares"));
  if (shares.shares().empty()) {
    return absl::InvalidArgumentError("secagg: a message of shares holds none");
  }
  const std::string& sender = shares.shares(0).sender();
  if (!keys_.contains(sender)) {
    return Invalid(sender, "the sender did not advertise keys in this round");
  }
  if (shares_.contains(sender)) {
    return absl::AlreadyExistsError(absl::StrCat("secagg: \"", sender, "\" already sent shares"));
  }
  absl::flat_hash_set<absl::string_view> recipients;
  for (const v1::EncryptedShare& share : shares.shares()) {
    if (share.sender() != sender) {
      return Invalid(sender, absl::StrCat("it holds a share from \"", share.sender(), "\""));
    }
    if (!round_.graph().AreNeighbours(sender, share.recipient()) ||
        !keys_.contains(share.recipient())) {
      return Invalid(sender, absl::StrCat("recipient \"", share.recipient(),
                                          "\" is not a neighbour that advertised keys"));
    }
    if (!recipients.insert(share.recipient()).second) {
      return Invalid(sender, absl::StrCat("two shares for \"", share.recipient(), "\""));
    }
    if (share.ciphertext().size() < kAeadNonceSize + kAeadTagSize) {
      return Invalid(sender,
                     absl::StrCat("the share for \"", share.recipient(), "\" has ",
                                  share.ciphertext().size(), " bytes, too short to be sealed"));
    }
  }
  for (const std::string& neighbour : round_.graph().Neighbours(sender)) {
    if (keys_.contains(neighbour) && !recipients.contains(neighbour)) {
      return Invalid(sender, absl::StrCat("no share for neighbour \"", neighbour, "\""));
    }
  }
  shares_.emplace(sender, shares);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, v1::EncryptedShares>> SecAggServer::CloseSharing() {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kSharing, "close sharing"));
  const IdSet shared = KeysOf(shares_);
  if (absl::Status s = CheckNeighbourhoods(shared, shared, "sharing keys"); !s.ok()) {
    return Fail(s);
  }
  std::map<std::string, v1::EncryptedShares> relayed;
  for (const std::string& id : shared) relayed[id];
  for (const auto& [sender, message] : shares_) {
    for (const v1::EncryptedShare& share : message.shares()) {
      auto it = relayed.find(share.recipient());
      if (it != relayed.end()) *it->second.add_shares() = share;
    }
  }
  sum_.assign(round_.vector_length(), 0);
  step_ = Step::kMasking;
  return relayed;
}

// --- Step 3 ---------------------------------------------------------------------------------

absl::Status SecAggServer::AddMaskedInput(const v1::MaskedInput& input) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kMasking, "take a masked input"));
  const std::string& id = input.participant_id();
  if (!shares_.contains(id)) return Invalid(id, "the sender did not share keys in this round");
  if (masked_.contains(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("secagg: \"", id, "\" already sent a masked input"));
  }
  if (partial_.contains(id)) return Invalid(id, "its masked input is coming in chunks");
  if (absl::Status s =
          AddPackedRingValues(input.values(), round_.ring_mask(), absl::MakeSpan(sum_));
      !s.ok()) {
    return Invalid(id, s.message());
  }
  masked_.insert(id);
  return absl::OkStatus();
}

absl::StatusOr<bool> SecAggServer::AddMaskedChunk(const std::string& id, std::string values) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kMasking, "take a masked input"));
  if (!shares_.contains(id)) return Invalid(id, "the sender did not share keys in this round");
  if (masked_.contains(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("secagg: \"", id, "\" already sent a masked input"));
  }
  PartialInput& partial = partial_[id];
  const size_t length = round_.vector_length();
  const size_t count = values.size() / 4;
  absl::Status s;
  if (values.size() % 4 != 0 || count > length - partial.values) {
    s = absl::InvalidArgumentError(absl::StrCat("masked input: a chunk of ", values.size(),
                                                " bytes after ", partial.values, " values of ",
                                                length, " is not whole values within them"));
  } else {
    s = AddPackedRingValues(values, round_.ring_mask(),
                            absl::MakeSpan(sum_).subspan(partial.values, count));
  }
  if (!s.ok()) {
    AbandonMaskedInput(id);
    return Invalid(id, s.message());
  }
  partial.values += count;
  if (partial.values < length) {
    partial.chunks.push_back(std::move(values));
    return false;
  }
  partial_.erase(id);
  masked_.insert(id);
  return true;
}

void SecAggServer::AbandonMaskedInput(absl::string_view id) {
  auto it = partial_.find(id);
  if (it == partial_.end()) return;
  size_t at = 0;
  for (const std::string& chunk : it->second.chunks) {
    const size_t count = chunk.size() / 4;
    SubtractPackedRingValues(chunk, round_.ring_mask(), absl::MakeSpan(sum_).subspan(at, count));
    at += count;
  }
  partial_.erase(it);
}

absl::StatusOr<std::map<std::string, v1::ConsistencyCheckRequest>> SecAggServer::CloseMasking() {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kMasking, "close masking"));
  // An input still incomplete is out of the sum: its sender dropped out.
  while (!partial_.empty()) AbandonMaskedInput(partial_.begin()->first);
  const IdSet shared = KeysOf(shares_);
  // A survivor's seed and a dropped participant's key each need threshold surviving holders.
  if (absl::Status s = CheckNeighbourhoods(shared, masked_, "masking"); !s.ok()) return Fail(s);
  survivors_.assign(masked_.begin(), masked_.end());
  v1::ConsistencyCheckRequest check;
  for (const std::string& id : survivors_) check.add_survivors(id);
  std::map<std::string, v1::ConsistencyCheckRequest> requests;
  for (const std::string& id : survivors_) requests[id] = check;
  step_ = Step::kConsistency;
  return requests;
}

// --- Step 4 ---------------------------------------------------------------------------------

absl::Status SecAggServer::AddSurvivorSignature(const v1::ConsistencyCheckResponse& signature) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kConsistency, "take a survivor-list signature"));
  const std::string& id = signature.participant_id();
  if (!masked_.contains(id)) return Invalid(id, "the signer is not on the survivor list");
  if (survivor_signatures_.contains(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("secagg: \"", id, "\" already signed the survivor list"));
  }
  if (absl::Status s = verifier_->Verify(id, SignedSurvivorsMessage(round_.round_id(), survivors_),
                                         signature.signature());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("secagg: the survivor-list signature of \"", id,
                                               "\" is refused: ", s.message()));
  }
  survivor_signatures_.emplace(id, signature.signature());
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, v1::UnmaskRequest>> SecAggServer::CloseConsistencyCheck() {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kConsistency, "close the consistency check"));
  const int signed_count = static_cast<int>(survivor_signatures_.size());
  if (signed_count < round_.threshold()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "consistency check: ", signed_count, " of the ", survivors_.size(),
        " survivors signed the survivor list, fewer than the threshold ", round_.threshold())));
  }
  // Only the signers are asked to unmask: each secret needs threshold of them among its holders.
  const IdSet signers = KeysOf(survivor_signatures_);
  if (absl::Status s = CheckNeighbourhoods(KeysOf(shares_), signers, "the consistency check");
      !s.ok()) {
    return Fail(s);
  }
  std::map<std::string, v1::UnmaskRequest> requests;
  for (const std::string& id : signers) {
    v1::UnmaskRequest& request = requests[id];
    for (const std::string& neighbour : round_.graph().Neighbours(id)) {
      if (masked_.contains(neighbour)) {
        request.add_survivors(neighbour);
      } else if (shares_.contains(neighbour)) {
        request.add_dropped(neighbour);
      }
    }
    for (const auto& [signer, bytes] : survivor_signatures_) {
      v1::ConsistencyCheckResponse* signature = request.add_survivor_signatures();
      signature->set_participant_id(signer);
      signature->set_signature(bytes);
    }
  }
  requests_.insert(requests.begin(), requests.end());
  step_ = Step::kUnmasking;
  return requests;
}

// --- Step 5 ---------------------------------------------------------------------------------

absl::Status SecAggServer::AddUnmaskResponse(const v1::UnmaskResponse& response) {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kUnmasking, "take an unmask response"));
  const std::string& id = response.participant_id();
  auto request = requests_.find(id);
  if (request == requests_.end()) return Invalid(id, "no unmask request was sent to it");
  if (responded_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("secagg: \"", id, "\" already answered"));
  }
  const v1::UnmaskRequest& asked = request->second;
  const auto named = [](const auto& ids, const std::string& owner) {
    return std::find(ids.begin(), ids.end(), owner) != ids.end();
  };
  if (response.shares_size() != asked.survivors_size() + asked.dropped_size()) {
    return Invalid(id,
                   absl::StrCat(response.shares_size(), " shares, ",
                                asked.survivors_size() + asked.dropped_size(), " were asked for"));
  }
  std::vector<std::pair<std::string, ShamirShare>> seeds;
  std::vector<std::pair<std::string, ShamirShare>> keys;
  absl::flat_hash_set<absl::string_view> owners;
  for (const v1::RevealedShare& revealed : response.shares()) {
    const std::string& owner = revealed.owner();
    const bool seed = revealed.share_case() == v1::RevealedShare::kSelfMaskSeedShare;
    if (seed ? !named(asked.survivors(), owner) : !named(asked.dropped(), owner)) {
      return Invalid(id, absl::StrCat("a ", seed ? "self-mask seed" : "mask key", " share of \"",
                                      owner, "\" was not asked for"));
    }
    if (!owners.insert(owner).second) {
      return Invalid(id, absl::StrCat("two shares of \"", owner, "\""));
    }
    absl::StatusOr<ShamirShare> share =
        ParseShamirShare(seed ? revealed.self_mask_seed_share() : revealed.mask_key_share());
    if (!share.ok()) {
      return Invalid(id, absl::StrCat("the share of \"", owner, "\": ", share.status().message()));
    }
    const uint32_t index = ShareIndex(owner, id);
    const size_t size = seed ? kMaskSeedSize : kX25519KeySize;
    if (share->index != index || share->secret_size != size) {
      return Invalid(
          id, absl::StrCat("the share of \"", owner, "\" has index ", share->index, " and size ",
                           share->secret_size, "; expected index ", index, " and size ", size));
    }
    (seed ? seeds : keys).emplace_back(owner, *std::move(share));
  }
  for (auto& [owner, share] : seeds) seed_shares_[owner].push_back(std::move(share));
  for (auto& [owner, share] : keys) key_shares_[owner].push_back(std::move(share));
  responded_.insert(id);
  return absl::OkStatus();
}

absl::StatusOr<std::string> SecAggServer::Reconstruct(
    const std::map<std::string, std::vector<ShamirShare>, std::less<>>& revealed,
    const std::string& owner, absl::string_view what) {
  auto it = revealed.find(owner);
  const size_t count = it == revealed.end() ? 0 : it->second.size();
  if (count < static_cast<size_t>(round_.threshold())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", what, " of \"", owner, "\" has ", count,
                     " shares revealed, fewer than the threshold ", round_.threshold()));
  }
  absl::StatusOr<std::string> secret = ShamirCombine(it->second, round_.threshold());
  if (!secret.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the revealed shares of the ", what, " of \"", owner,
                     "\" do not agree: ", secret.status().message()));
  }
  return secret;
}

absl::StatusOr<std::vector<uint32_t>> SecAggServer::CloseUnmasking() {
  SHOAL_RETURN_IF_ERROR(Expect(Step::kUnmasking, "close unmasking"));
  // Every secret is reconstructed before the sum is touched, so a failure leaves nothing half
  // unmasked.
  std::vector<std::string> seeds;
  for (const std::string& id : survivors_) {
    absl::StatusOr<std::string> seed = Reconstruct(seed_shares_, id, "self-mask seed");
    if (!seed.ok()) return Fail(seed.status());
    seeds.push_back(*std::move(seed));
  }
  std::vector<std::pair<std::string, std::string>> dropped_keys;  // id, mask private key
  for (const auto& [id, unused] : shares_) {
    if (masked_.contains(id)) continue;
    absl::StatusOr<std::string> key = Reconstruct(key_shares_, id, "mask key");
    if (!key.ok()) return Fail(key.status());
    absl::StatusOr<KeyPair> pair = X25519KeyPairFromPrivateKey(*key);
    if (!pair.ok() || pair->public_key != keys_.at(id).mask_public_key()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "the reconstructed mask key of \"", id, "\" does not match the key it advertised")));
    }
    dropped_keys.emplace_back(id, *std::move(key));
  }
  // Every mask comes off the sum in one pass over it.
  absl::StatusOr<MaskStreams> masks = MaskStreams::Create(round_.bits());
  absl::Status status = masks.status();
  for (const std::string& seed : seeds) {
    if (status.ok()) status = masks->Add(seed, MaskSign::kSubtract);
  }
  for (auto& [dropped, key] : dropped_keys) {
    for (const std::string& neighbour : round_.graph().Neighbours(dropped)) {
      if (!status.ok() || !masked_.contains(neighbour)) continue;
      // The survivor applied PairwiseMaskSign(neighbour, dropped); undo it.
      absl::StatusOr<std::string> seed =
          PairwiseMaskSeed(round_.round_id(), key, keys_.at(neighbour).mask_public_key());
      absl::StatusOr<MaskSign> sign = PairwiseMaskSign(neighbour, dropped);
      status = !seed.ok() ? seed.status() : !sign.ok() ? sign.status() : absl::OkStatus();
      if (status.ok()) status = masks->Add(*seed, Opposite(*sign));
      if (seed.ok()) Scrub(*seed);
    }
    Scrub(key);
  }
  for (std::string& seed : seeds) Scrub(seed);
  if (status.ok()) status = masks->ApplyNext(absl::MakeSpan(sum_));
  if (!status.ok()) return Fail(status);
  step_ = Step::kDone;
  return std::move(sum_);
}

}  // namespace shoal::privacy::secagg
