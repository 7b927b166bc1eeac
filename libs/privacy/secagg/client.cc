#include "libs/privacy/secagg/client.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/wire.h"
#include "libs/privacy/shamir.h"

namespace shoal::privacy::secagg {
namespace {

const char* ClientStepName(int step) {
  static const char* const kNames[] = {"advertising keys",  "sharing keys",
                                       "masking the input", "signing the survivor list",
                                       "unmasking",         "done"};
  return step >= 0 && step < 6 ? kNames[step] : "refused";
}

}  // namespace

absl::StatusOr<std::unique_ptr<SecAggClient>> SecAggClient::Create(
    const v1::SecAggConfig& config, std::string self_id, std::shared_ptr<const KeySigner> signer,
    std::shared_ptr<const KeyVerifier> verifier) {
  SHOAL_ASSIGN_OR_RETURN(SecAggRound round, SecAggRound::Create(config));
  if (!round.graph().Contains(self_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secagg client: \"", self_id, "\" is not a participant of round ", round.round_id()));
  }
  if (signer == nullptr || verifier == nullptr) {
    return absl::InvalidArgumentError("secagg client: a key signer and a key verifier are needed");
  }
  return std::unique_ptr<SecAggClient>(new SecAggClient(std::move(round), std::move(self_id),
                                                        std::move(signer), std::move(verifier)));
}

SecAggClient::SecAggClient(SecAggRound round, std::string self_id,
                           std::shared_ptr<const KeySigner> signer,
                           std::shared_ptr<const KeyVerifier> verifier)
    : round_(std::move(round)),
      self_id_(std::move(self_id)),
      signer_(std::move(signer)),
      verifier_(std::move(verifier)) {}

SecAggClient::~SecAggClient() { ScrubSecrets(); }

void SecAggClient::ScrubSecrets() {
  Scrub(encryption_keys_.private_key);
  Scrub(mask_keys_.private_key);
  Scrub(self_mask_seed_);
  for (auto& [owner, pair] : held_shares_) {
    Scrub(*pair.mutable_self_mask_seed_share());
    Scrub(*pair.mutable_mask_key_share());
  }
  held_shares_.clear();
}

absl::Status SecAggClient::Begin(Step step, absl::string_view what) {
  if (step_ == Step::kRefused) {
    return absl::FailedPreconditionError(
        absl::StrCat("secagg client ", self_id_, ": cannot ", what,
                     ": the round ended on an earlier refusal: ", refusal_.message()));
  }
  if (step_ != step) {
    return Refuse(absl::FailedPreconditionError(
        absl::StrCat("cannot ", what, " while ", ClientStepName(static_cast<int>(step_)),
                     " (the steps run once each, in order)")));
  }
  return absl::OkStatus();
}

absl::Status SecAggClient::Refuse(absl::Status error) {
  ScrubSecrets();
  step_ = Step::kRefused;
  refusal_ =
      absl::Status(error.code(), absl::StrCat("secagg client ", self_id_, ": ", error.message()));
  return refusal_;
}

absl::StatusOr<v1::AdvertisedKeys> SecAggClient::AdvertiseKeys() {
  if (absl::Status s = Begin(Step::kAdvertise, "advertise keys"); !s.ok()) return s;
  absl::StatusOr<KeyPair> encryption = GenerateX25519KeyPair();
  if (!encryption.ok()) return Refuse(encryption.status());
  encryption_keys_ = *std::move(encryption);
  absl::StatusOr<KeyPair> mask = GenerateX25519KeyPair();
  if (!mask.ok()) return Refuse(mask.status());
  mask_keys_ = *std::move(mask);
  absl::StatusOr<std::string> signature = signer_->Sign(SignedKeysMessage(
      round_.round_id(), self_id_, encryption_keys_.public_key, mask_keys_.public_key));
  if (!signature.ok()) return Refuse(signature.status());
  v1::AdvertisedKeys keys;
  keys.set_participant_id(self_id_);
  keys.set_encryption_public_key(encryption_keys_.public_key);
  keys.set_mask_public_key(mask_keys_.public_key);
  keys.set_signature(*std::move(signature));
  step_ = Step::kShare;
  return keys;
}

absl::StatusOr<v1::EncryptedShares> SecAggClient::ShareKeys(const v1::KeyBundle& bundle) {
  if (absl::Status s = Begin(Step::kShare, "share keys"); !s.ok()) return s;
  const NeighbourhoodGraph& graph = round_.graph();
  for (const v1::AdvertisedKeys& keys : bundle.keys()) {
    const std::string& id = keys.participant_id();
    if (!graph.AreNeighbours(self_id_, id)) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("key bundle: \"", id, "\" is not a neighbour of this participant")));
    }
    if (neighbour_keys_.contains(id)) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("key bundle: the keys of \"", id, "\" are listed twice")));
    }
    for (auto [what, key] : {std::pair{"encryption public key", &keys.encryption_public_key()},
                             std::pair{"mask public key", &keys.mask_public_key()}}) {
      if (absl::Status s =
              CheckPublicKey(absl::StrCat("key bundle: ", what, " of \"", id, "\""), *key);
          !s.ok()) {
        return Refuse(s);
      }
    }
    if (absl::Status s =
            verifier_->Verify(id,
                              SignedKeysMessage(round_.round_id(), id, keys.encryption_public_key(),
                                                keys.mask_public_key()),
                              keys.signature());
        !s.ok()) {
      return Refuse(absl::Status(s.code(), absl::StrCat("key bundle: the keys of \"", id,
                                                        "\" are refused: ", s.message())));
    }
    neighbour_keys_.emplace(id, keys);
  }
  const int present = static_cast<int>(neighbour_keys_.size());
  if (present < round_.threshold()) {
    return Refuse(absl::FailedPreconditionError(absl::StrCat(
        "key bundle: ", present, " of this participant's ", graph.Neighbours(self_id_).size(),
        " neighbours advertised keys, fewer than the threshold ", round_.threshold())));
  }
  absl::StatusOr<std::string> seed = RandomBytes(kMaskSeedSize);
  if (!seed.ok()) return Refuse(seed.status());
  self_mask_seed_ = *std::move(seed);
  absl::StatusOr<std::vector<ShamirShare>> seed_shares =
      ShamirSplit(self_mask_seed_, round_.threshold(), present);
  if (!seed_shares.ok()) return Refuse(seed_shares.status());
  absl::StatusOr<std::vector<ShamirShare>> key_shares =
      ShamirSplit(mask_keys_.private_key, round_.threshold(), present);
  if (!key_shares.ok()) return Refuse(key_shares.status());
  absl::Cleanup scrub_shares = [&] {
    Scrub(*seed_shares);
    Scrub(*key_shares);
  };
  // The i-th neighbour in id order holds share i + 1, as the aggregator expects.
  v1::EncryptedShares out;
  size_t i = 0;
  for (const auto& [id, keys] : neighbour_keys_) {
    absl::StatusOr<std::string> key =
        ShareKey(round_.round_id(), encryption_keys_.private_key, keys.encryption_public_key());
    if (!key.ok()) return Refuse(key.status());
    v1::SharePair pair;
    pair.set_self_mask_seed_share(SerializeShamirShare((*seed_shares)[i]));
    pair.set_mask_key_share(SerializeShamirShare((*key_shares)[i]));
    std::string plaintext = pair.SerializeAsString();
    absl::StatusOr<std::string> sealed =
        AeadSealRandomNonce(*key, plaintext, ShareAssociatedData(round_.round_id(), self_id_, id));
    Scrub(plaintext);
    Scrub(*pair.mutable_self_mask_seed_share());
    Scrub(*pair.mutable_mask_key_share());
    Scrub(*key);
    if (!sealed.ok()) return Refuse(sealed.status());
    v1::EncryptedShare* share = out.add_shares();
    share->set_sender(self_id_);
    share->set_recipient(id);
    share->set_ciphertext(*std::move(sealed));
    ++i;
  }
  step_ = Step::kMask;
  return out;
}

absl::StatusOr<v1::MaskedInput> SecAggClient::MaskInput(const v1::EncryptedShares& shares,
                                                        absl::Span<const uint32_t> input) {
  if (absl::Status s = Begin(Step::kMask, "mask the input"); !s.ok()) return s;
  if (input.size() != round_.vector_length()) {
    return Refuse(absl::InvalidArgumentError(absl::StrCat("input: ", input.size(),
                                                          " values, the round's vector_length is ",
                                                          round_.vector_length())));
  }
  for (size_t i = 0; round_.ring_mask() != 0xffffffffu && i < input.size(); ++i) {
    if (input[i] > round_.ring_mask()) {
      return Refuse(absl::InvalidArgumentError(absl::StrCat("input: value ", i, " (", input[i],
                                                            ") is outside the ring of ",
                                                            round_.bits(), " bits")));
    }
  }
  return MaskBlocks(shares,
                    [input](size_t start, absl::Span<uint32_t> block) {
                      std::copy_n(input.begin() + start, block.size(), block.begin());
                      return absl::OkStatus();
                    },
                    {});
}

absl::StatusOr<v1::MaskedInput> SecAggClient::MaskInput(const v1::EncryptedShares& shares,
                                                        const InputBlocks& input,
                                                        std::string buffer) {
  if (absl::Status s = Begin(Step::kMask, "mask the input"); !s.ok()) return s;
  const uint32_t ring = round_.ring_mask();
  if (ring == 0xffffffffu) return MaskBlocks(shares, input, std::move(buffer));
  return MaskBlocks(
      shares,
      [&input, ring, this](size_t start, absl::Span<uint32_t> block) -> absl::Status {
        if (absl::Status s = input(start, block); !s.ok()) return s;
        for (size_t i = 0; i < block.size(); ++i) {
          if (block[i] > ring) {
            return absl::InvalidArgumentError(absl::StrCat("input: value ", start + i, " (",
                                                           block[i], ") is outside the ring of ",
                                                           round_.bits(), " bits"));
          }
        }
        return absl::OkStatus();
      },
      std::move(buffer));
}

absl::Status SecAggClient::OpenShares(const v1::EncryptedShares& shares) {
  for (const v1::EncryptedShare& share : shares.shares()) {
    const std::string& from = share.sender();
    if (share.recipient() != self_id_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shares: the share from \"", from, "\" is addressed to \"", share.recipient(), "\""));
    }
    auto keys = neighbour_keys_.find(from);
    if (keys == neighbour_keys_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shares: \"", from, "\" is not a neighbour whose keys this participant received"));
    }
    if (held_shares_.contains(from)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shares: \"", from, "\" sent more than one share"));
    }
    absl::StatusOr<std::string> key = ShareKey(round_.round_id(), encryption_keys_.private_key,
                                               keys->second.encryption_public_key());
    if (!key.ok()) return key.status();
    absl::StatusOr<std::string> plaintext = AeadOpenPrefixedNonce(
        *key, share.ciphertext(), ShareAssociatedData(round_.round_id(), from, self_id_));
    Scrub(*key);
    if (!plaintext.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shares: the share from \"", from,
                       "\" does not open (altered, or sealed for another round or participant): ",
                       plaintext.status().message()));
    }
    v1::SharePair pair;
    const bool parsed = pair.ParseFromString(*plaintext);
    Scrub(*plaintext);
    if (!parsed || !ParseShamirShare(pair.self_mask_seed_share()).ok() ||
        !ParseShamirShare(pair.mask_key_share()).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shares: the share from \"", from, "\" opens to no pair of Shamir shares"));
    }
    held_shares_.emplace(from, std::move(pair));
  }
  const int senders = static_cast<int>(held_shares_.size());
  if (senders < round_.threshold()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shares: ", senders, " neighbours sent shares, fewer than the threshold ",
                     round_.threshold()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::MaskedInput> SecAggClient::MaskBlocks(const v1::EncryptedShares& shares,
                                                         const InputBlocks& input,
                                                         std::string buffer) {
  if (absl::Status s = OpenShares(shares); !s.ok()) return Refuse(s);
  // The self mask and every pairwise mask, added to the input a block at a time as it is
  // written, the masked block packed straight into the message's values.
  absl::StatusOr<MaskStreams> masks = MaskStreams::Create(round_.bits());
  if (!masks.ok()) return Refuse(masks.status());
  if (absl::Status s = masks->Add(self_mask_seed_, MaskSign::kAdd); !s.ok()) return Refuse(s);
  for (const auto& [peer, unused] : held_shares_) {
    absl::StatusOr<std::string> seed = PairwiseMaskSeed(round_.round_id(), mask_keys_.private_key,
                                                        neighbour_keys_.at(peer).mask_public_key());
    if (!seed.ok()) return Refuse(seed.status());
    absl::StatusOr<MaskSign> sign = PairwiseMaskSign(self_id_, peer);
    if (!sign.ok()) return Refuse(sign.status());
    absl::Status s = masks->Add(*seed, *sign);
    Scrub(*seed);
    if (!s.ok()) return Refuse(s);
  }
  const size_t length = round_.vector_length();
  buffer.resize(4 * length);  // no allocation when a reused buffer has the room
  constexpr size_t kBlock = 4096;
  uint32_t block[kBlock];
  for (size_t start = 0; start < length; start += kBlock) {
    const size_t n = std::min(kBlock, length - start);
    const absl::Span<uint32_t> values = absl::MakeSpan(block, n);
    if (absl::Status s = input(start, values); !s.ok()) return Refuse(s);
    if (absl::Status s = masks->ApplyNext(values); !s.ok()) return Refuse(s);
    PackRingValuesTo(values, buffer.data() + 4 * start);
  }
  v1::MaskedInput out;
  out.set_participant_id(self_id_);
  out.set_values(std::move(buffer));
  step_ = Step::kSign;
  return out;
}

absl::StatusOr<v1::ConsistencyCheckResponse> SecAggClient::SignSurvivors(
    const v1::ConsistencyCheckRequest& request) {
  if (absl::Status s = Begin(Step::kSign, "sign the survivor list"); !s.ok()) return s;
  const NeighbourhoodGraph& graph = round_.graph();
  std::vector<std::string> survivors(request.survivors().begin(), request.survivors().end());
  bool listed = false;
  int neighbours = 0;
  for (size_t i = 0; i < survivors.size(); ++i) {
    const std::string& id = survivors[i];
    if (i > 0 && !(survivors[i - 1] < id)) {
      return Refuse(absl::InvalidArgumentError(absl::StrCat(
          "survivor list: not sorted by id without repeats at \"", id, "\" (entry ", i, ")")));
    }
    if (!graph.Contains(id)) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("survivor list: \"", id, "\" is not a participant of this round")));
    }
    if (id == self_id_) {
      listed = true;
    } else if (graph.AreNeighbours(self_id_, id)) {
      if (!held_shares_.contains(id)) {
        return Refuse(absl::InvalidArgumentError(
            absl::StrCat("survivor list: neighbour \"", id,
                         "\" sent this participant no shares, so it sent no masked input")));
      }
      ++neighbours;
    }
  }
  if (!listed) {
    return Refuse(absl::InvalidArgumentError(
        "survivor list: this participant sent a masked input but is not on the list"));
  }
  if (neighbours < round_.threshold()) {
    return Refuse(
        absl::FailedPreconditionError(absl::StrCat("survivor list: ", neighbours,
                                                   " of this participant's neighbours, fewer than "
                                                   "the threshold ",
                                                   round_.threshold())));
  }
  absl::StatusOr<std::string> signature =
      signer_->Sign(SignedSurvivorsMessage(round_.round_id(), survivors));
  if (!signature.ok()) return Refuse(signature.status());
  signed_survivors_ = std::move(survivors);
  v1::ConsistencyCheckResponse out;
  out.set_participant_id(self_id_);
  out.set_signature(*std::move(signature));
  step_ = Step::kUnmask;
  return out;
}

absl::Status SecAggClient::CheckConsistency(const v1::UnmaskRequest& request) const {
  const auto on_list = [&](const std::string& id) {
    return std::binary_search(signed_survivors_.begin(), signed_survivors_.end(), id);
  };
  const std::string message = SignedSurvivorsMessage(round_.round_id(), signed_survivors_);
  absl::flat_hash_set<absl::string_view> signers;
  for (const v1::ConsistencyCheckResponse& signature : request.survivor_signatures()) {
    const std::string& id = signature.participant_id();
    if (!on_list(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unmask request: the survivor-list signature of \"", id,
                       "\" is not from a survivor on the list this participant signed"));
    }
    if (!signers.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("unmask request: two survivor-list signatures of \"", id, "\""));
    }
    if (absl::Status s = verifier_->Verify(id, message, signature.signature()); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("unmask request: the survivor-list signature of \"", id,
                                 "\" does not verify over the list of ", signed_survivors_.size(),
                                 " survivors this participant signed (forged, or the aggregator "
                                 "sent participants different lists): ",
                                 s.message()));
    }
  }
  if (static_cast<int>(signers.size()) < round_.threshold()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unmask request: ", signers.size(),
        " signatures of the survivor list this participant signed, fewer than the threshold ",
        round_.threshold()));
  }
  for (const std::string& id : request.survivors()) {
    if (!on_list(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unmask request: survivor \"", id,
                       "\" is not on the survivor list this participant "
                       "signed"));
    }
  }
  for (const std::string& id : request.dropped()) {
    if (on_list(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unmask request: dropped \"", id, "\" is on the survivor list this participant signed"));
    }
  }
  if (static_cast<size_t>(request.survivors_size() + request.dropped_size()) !=
      held_shares_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unmask request: names ", request.survivors_size() + request.dropped_size(),
        " neighbours, not the ", held_shares_.size(), " that sent this participant shares"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::UnmaskResponse> SecAggClient::Unmask(const v1::UnmaskRequest& request) {
  if (absl::Status s = Begin(Step::kUnmask, "unmask"); !s.ok()) return s;
  // Every id named once, in one list only, and a neighbour whose shares this participant holds.
  absl::flat_hash_set<absl::string_view> named;
  for (auto [list, what] :
       {std::pair{&request.survivors(), "survivor"}, std::pair{&request.dropped(), "dropped"}}) {
    for (const std::string& id : *list) {
      if (!held_shares_.contains(id)) {
        return Refuse(absl::InvalidArgumentError(
            absl::StrCat("unmask request: ", what, " \"", id,
                         "\" is not a neighbour that sent this participant shares")));
      }
      if (!named.insert(id).second) {
        const bool both = std::find(request.survivors().begin(), request.survivors().end(), id) !=
                              request.survivors().end() &&
                          std::find(request.dropped().begin(), request.dropped().end(), id) !=
                              request.dropped().end();
        return Refuse(absl::InvalidArgumentError(
            both ? absl::StrCat("unmask request: \"", id,
                                "\" is named both as a survivor and as dropped; revealing both "
                                "of its shares would unmask its input")
                 : absl::StrCat("unmask request: ", what, " \"", id, "\" is named twice")));
      }
    }
  }
  if (absl::Status s = CheckConsistency(request); !s.ok()) return Refuse(s);
  const int survivors = request.survivors_size();
  if (survivors < round_.threshold()) {
    return Refuse(absl::FailedPreconditionError(
        absl::StrCat("unmask request: ", survivors,
                     " surviving neighbours, fewer than the threshold ", round_.threshold())));
  }
  v1::UnmaskResponse out;
  out.set_participant_id(self_id_);
  for (const std::string& id : request.survivors()) {
    v1::RevealedShare* share = out.add_shares();
    share->set_owner(id);
    share->set_self_mask_seed_share(held_shares_.at(id).self_mask_seed_share());
  }
  for (const std::string& id : request.dropped()) {
    v1::RevealedShare* share = out.add_shares();
    share->set_owner(id);
    share->set_mask_key_share(held_shares_.at(id).mask_key_share());
  }
  ScrubSecrets();
  step_ = Step::kDone;
  return out;
}

}  // namespace shoal::privacy::secagg
