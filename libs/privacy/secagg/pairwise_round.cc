#include "libs/privacy/secagg/pairwise_round.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/masks.h"
#include "libs/privacy/secagg/wire.h"

namespace shoal::privacy::secagg {
namespace {

absl::Status CheckRingBits(int bits) {
  if (bits < 1 || bits > 32) {
    return absl::InvalidArgumentError(absl::StrCat("ring bits ", bits, " out of 1..32"));
  }
  return absl::OkStatus();
}

// Sorted, or the first duplicate named.
absl::StatusOr<std::vector<std::string>> SortedUniqueIds(std::vector<std::string> ids,
                                                         absl::string_view what) {
  std::sort(ids.begin(), ids.end());
  auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", *dup, "\" appears twice"));
  }
  return ids;
}

MaskSign OppositeSign(MaskSign sign) {
  return sign == MaskSign::kAdd ? MaskSign::kSubtract : MaskSign::kAdd;
}

std::string IdList(const std::vector<std::string>& ids) {
  return ids.empty() ? "none" : absl::StrJoin(ids, ", ");
}

}  // namespace

std::string MaskKeyMessage(absl::string_view round_id, absl::string_view participant_id,
                           absl::string_view public_key) {
  return Framed({"shoal.secagg.v1 pairwise mask key", round_id, participant_id, public_key});
}

PairwiseMasker::PairwiseMasker(std::string round_id, std::string self_id, std::string private_key,
                               std::string public_key)
    : round_id_(std::move(round_id)),
      self_id_(std::move(self_id)),
      private_key_(std::move(private_key)),
      public_key_(std::move(public_key)) {}

PairwiseMasker::~PairwiseMasker() {
  Scrub(private_key_);
  Scrub(self_seed_);
  for (auto& [id, seed] : pair_seeds_) Scrub(seed);
}

absl::StatusOr<PairwiseMasker> PairwiseMasker::Create(std::string round_id, std::string self_id) {
  if (self_id.empty()) return absl::InvalidArgumentError("pairwise masking: empty participant id");
  absl::StatusOr<KeyPair> keys = GenerateX25519KeyPair();
  if (!keys.ok()) return keys.status();
  return PairwiseMasker(std::move(round_id), std::move(self_id), std::move(keys->private_key),
                        std::move(keys->public_key));
}

absl::StatusOr<MaskKey> PairwiseMasker::Advertise(const KeySigner& signer) const {
  absl::StatusOr<std::string> signature =
      signer.Sign(MaskKeyMessage(round_id_, self_id_, public_key_));
  if (!signature.ok()) return signature.status();
  return MaskKey{public_key_, *std::move(signature)};
}

absl::StatusOr<std::vector<uint32_t>> PairwiseMasker::Mask(
    uint32_t attempt, const std::map<std::string, MaskKey>& participants,
    const KeyVerifier& verifier, absl::Span<const uint32_t> encoded, int bits) {
  if (!committed_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round_id_, ": ", self_id_, " already revealed its seeds; it masks no more"));
  }
  if (absl::Status s = CheckRingBits(bits); !s.ok()) return s;
  if (participants.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", round_id_, ": masking needs at least 2 participants, got ", participants.size()));
  }
  auto self = participants.find(self_id_);
  if (self == participants.end() || self->second.public_key != public_key_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", round_id_, ": the participants list ",
        self == participants.end() ? "does not list " : "lists another mask key for ", self_id_));
  }
  std::map<std::string, std::string> pair_seeds;
  std::vector<std::string> ids;
  const std::string attempt_label = absl::StrCat(attempt);
  for (const auto& [id, key] : participants) {
    ids.push_back(id);
    if (id == self_id_) continue;
    if (absl::Status s =
            verifier.Verify(id, MaskKeyMessage(round_id_, id, key.public_key), key.signature);
        !s.ok()) {
      return s;
    }
    const absl::string_view low = std::min<absl::string_view>(id, self_id_);
    const absl::string_view high = std::max<absl::string_view>(id, self_id_);
    absl::StatusOr<std::string> seed = DeriveSharedSeed(
        private_key_, key.public_key,
        Framed({"shoal.secagg.v1 pairwise mask", round_id_, attempt_label, low, high}));
    if (!seed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("round ", round_id_, ": the mask key of ", id,
                                                     ": ", seed.status().message()));
    }
    pair_seeds.emplace(id, *std::move(seed));
  }
  absl::StatusOr<std::string> self_seed = RandomBytes(kMaskSeedSize);
  if (!self_seed.ok()) return self_seed.status();
  std::vector<uint32_t> masked(encoded.begin(), encoded.end());
  const uint32_t ring = bits == 32 ? ~uint32_t{0} : (uint32_t{1} << bits) - 1;
  for (uint32_t& v : masked) v &= ring;
  // The self mask and every pairwise mask in one pass over the values.
  absl::StatusOr<MaskStreams> masks = MaskStreams::Create(bits);
  if (!masks.ok()) return masks.status();
  if (absl::Status s = masks->Add(*self_seed, MaskSign::kAdd); !s.ok()) return s;
  for (const auto& [id, seed] : pair_seeds) {
    absl::StatusOr<MaskSign> sign = PairwiseMaskSign(self_id_, id);
    if (!sign.ok()) return sign.status();
    if (absl::Status s = masks->Add(seed, *sign); !s.ok()) return s;
  }
  if (absl::Status s = masks->ApplyNext(absl::MakeSpan(masked)); !s.ok()) return s;
  Scrub(self_seed_);
  for (auto& [id, seed] : pair_seeds_) Scrub(seed);
  masked_ = true;
  attempt_ = attempt;
  masked_with_ = std::move(ids);  // a map's keys: ascending
  self_seed_ = *std::move(self_seed);
  pair_seeds_ = std::move(pair_seeds);
  return masked;
}

absl::StatusOr<MaskReveal> PairwiseMasker::Reveal(uint32_t attempt,
                                                  const std::vector<std::string>& survivors) {
  if (!masked_ || attempt != attempt_) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_id_, ": ", self_id_, " did not mask at attempt ", attempt));
  }
  absl::StatusOr<std::vector<std::string>> s = SortedUniqueIds(survivors, "survivors");
  if (!s.ok()) return s.status();
  for (const std::string& id : *s) {
    if (!std::binary_search(masked_with_.begin(), masked_with_.end(), id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("round ", round_id_, ": survivor ", id, " was not masked with"));
    }
  }
  if (!std::binary_search(s->begin(), s->end(), self_id_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_id_, ": ", self_id_,
                     " is not among the survivors; it reveals nothing (its update is not in the "
                     "sum)"));
  }
  if (!committed_.empty() && committed_ != *s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round_id_, ": ", self_id_, " revealed its seeds for the survivors ",
        IdList(committed_), " and reveals for no other set (asked for ", IdList(*s), ")"));
  }
  committed_ = *s;
  MaskReveal reveal;
  reveal.self_seed = self_seed_;
  for (const auto& [id, seed] : pair_seeds_) {
    if (!std::binary_search(s->begin(), s->end(), id)) reveal.pair_seeds.emplace(id, seed);
  }
  return reveal;
}

MaskedSum::MaskedSum(std::vector<std::string> masked_with, std::vector<std::string> survivors,
                     std::vector<std::string> dropped, size_t size, int bits)
    : masked_with_(std::move(masked_with)),
      survivors_(std::move(survivors)),
      dropped_(std::move(dropped)),
      bits_(bits),
      sum_(size, 0) {
  for (const std::string& id : survivors_) {
    added_[id] = false;
    unmasked_[id] = false;
  }
}

absl::StatusOr<MaskedSum> MaskedSum::Start(std::vector<std::string> masked_with,
                                           std::vector<std::string> survivors, size_t size,
                                           int bits) {
  if (absl::Status s = CheckRingBits(bits); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> p =
      SortedUniqueIds(std::move(masked_with), "masked with");
  if (!p.ok()) return p.status();
  absl::StatusOr<std::vector<std::string>> s = SortedUniqueIds(std::move(survivors), "survivors");
  if (!s.ok()) return s.status();
  if (s->empty()) return absl::InvalidArgumentError("masked sum: no survivors");
  std::vector<std::string> dropped;
  std::set_difference(p->begin(), p->end(), s->begin(), s->end(), std::back_inserter(dropped));
  if (p->size() - dropped.size() != s->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("masked sum: survivors ", IdList(*s), " are not all among ", IdList(*p)));
  }
  return MaskedSum(*std::move(p), *std::move(s), std::move(dropped), size, bits);
}

bool MaskedSum::IsSurvivor(const std::string& peer_id) const {
  return std::binary_search(survivors_.begin(), survivors_.end(), peer_id);
}

absl::Status MaskedSum::AddMasked(const std::string& peer_id, absl::Span<const uint32_t> masked) {
  if (!IsSurvivor(peer_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("masked update of ", peer_id, ", which is not among the survivors"));
  }
  if (added_[peer_id]) {
    return absl::InvalidArgumentError(absl::StrCat("masked update of ", peer_id, " given twice"));
  }
  if (masked.size() != sum_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "masked update of ", peer_id, ": ", masked.size(), " values, expected ", sum_.size()));
  }
  if (absl::Status s = RingAdd(absl::MakeSpan(sum_), masked, bits_); !s.ok()) return s;
  added_[peer_id] = true;
  return absl::OkStatus();
}

absl::Status MaskedSum::Unmask(const std::string& peer_id, const MaskReveal& reveal) {
  if (!IsSurvivor(peer_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("seeds of ", peer_id, ", which is not among the survivors"));
  }
  if (unmasked_[peer_id]) {
    return absl::InvalidArgumentError(absl::StrCat("seeds of ", peer_id, " given twice"));
  }
  std::vector<std::string> revealed;
  for (const auto& [id, seed] : reveal.pair_seeds) revealed.push_back(id);
  if (revealed != dropped_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seeds of ", peer_id, ": pairwise seeds with ", IdList(revealed),
                     ", expected exactly the dropped participants (", IdList(dropped_), ")"));
  }
  for (const auto& [id, seed] : reveal.pair_seeds) {
    if (seed.size() != kMaskSeedSize) {
      return absl::InvalidArgumentError(absl::StrCat("seeds of ", peer_id, ": the seed with ", id,
                                                     " has ", seed.size(), " bytes"));
    }
  }
  if (reveal.self_seed.size() != kMaskSeedSize) {
    return absl::InvalidArgumentError(absl::StrCat("seeds of ", peer_id, ": the self seed has ",
                                                   reveal.self_seed.size(), " bytes"));
  }
  // Every mask is set up before the sum is touched, then taken off in one pass.
  absl::StatusOr<MaskStreams> masks = MaskStreams::Create(bits_);
  if (!masks.ok()) return masks.status();
  if (absl::Status s = masks->Add(reveal.self_seed, MaskSign::kSubtract); !s.ok()) return s;
  for (const auto& [id, seed] : reveal.pair_seeds) {
    absl::StatusOr<MaskSign> sign = PairwiseMaskSign(peer_id, id);
    if (!sign.ok()) return sign.status();
    if (absl::Status s = masks->Add(seed, OppositeSign(*sign)); !s.ok()) return s;
  }
  if (absl::Status s = masks->ApplyNext(absl::MakeSpan(sum_)); !s.ok()) return s;
  unmasked_[peer_id] = true;
  return absl::OkStatus();
}

bool MaskedSum::complete() const {
  for (const std::string& id : survivors_) {
    if (!added_.at(id) || !unmasked_.at(id)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<uint32_t>> MaskedSum::Finish() const {
  std::vector<std::string> no_update;
  std::vector<std::string> no_seeds;
  for (const std::string& id : survivors_) {
    if (!added_.at(id)) no_update.push_back(id);
    if (!unmasked_.at(id)) no_seeds.push_back(id);
  }
  if (!no_update.empty() || !no_seeds.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("masked sum incomplete: masked updates missing from ", IdList(no_update),
                     "; seeds missing from ", IdList(no_seeds)));
  }
  return sum_;
}

}  // namespace shoal::privacy::secagg
