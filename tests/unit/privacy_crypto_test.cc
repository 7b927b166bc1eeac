#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

std::string Hex(absl::string_view hex) { return absl::HexStringToBytes(hex); }
std::string ToHex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

TEST(X25519Test, Rfc7748ScalarMultiplication) {
  // RFC 7748 §5.2, the first test vector: scalar × u-coordinate.
  auto out =
      X25519SharedSecret(Hex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4"),
                         Hex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(ToHex(*out), "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552");
}

TEST(X25519Test, Rfc7748DiffieHellman) {
  // RFC 7748 §6.1.
  auto alice = X25519KeyPairFromPrivateKey(
      Hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"));
  auto bob = X25519KeyPairFromPrivateKey(
      Hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"));
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_EQ(ToHex(alice->public_key),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  EXPECT_EQ(ToHex(bob->public_key),
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  const std::string shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";
  EXPECT_EQ(ToHex(*X25519SharedSecret(alice->private_key, bob->public_key)), shared);
  EXPECT_EQ(ToHex(*X25519SharedSecret(bob->private_key, alice->public_key)), shared);
}

TEST(X25519Test, BothSidesDeriveTheSameSeedAndContextsSeparate) {
  auto a = GenerateX25519KeyPair();
  auto b = GenerateX25519KeyPair();
  auto c = GenerateX25519KeyPair();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->private_key.size(), kX25519KeySize);
  EXPECT_NE(a->public_key, b->public_key);
  auto ab = DeriveSharedSeed(a->private_key, b->public_key, "task 7 round 3 pairwise");
  auto ba = DeriveSharedSeed(b->private_key, a->public_key, "task 7 round 3 pairwise");
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(ab->size(), kSharedSeedSize);
  EXPECT_EQ(*ab, *ba);
  EXPECT_NE(*ab, *DeriveSharedSeed(a->private_key, b->public_key, "task 7 round 4 pairwise"));
  EXPECT_NE(*ab, *DeriveSharedSeed(a->private_key, c->public_key, "task 7 round 3 pairwise"));
  // The seed is HKDF over the raw secret, never the raw secret itself.
  EXPECT_NE(*ab, *X25519SharedSecret(a->private_key, b->public_key));
}

TEST(X25519Test, RefusesBadKeys) {
  auto a = GenerateX25519KeyPair();
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(X25519SharedSecret(a->private_key, "short").status().message(),
              HasSubstr("X25519 public key must be 32 bytes, got 5"));
  EXPECT_THAT(X25519KeyPairFromPrivateKey(std::string(31, 'x')).status().message(),
              HasSubstr("X25519 private key must be 32 bytes"));
  // u = 0 is a small-order point: the agreement would be all zeros, and a peer could force it.
  EXPECT_THAT(X25519SharedSecret(a->private_key, std::string(32, '\0')).status().message(),
              HasSubstr("small-order"));
}

TEST(HkdfTest, Rfc5869TestCase1) {
  auto okm = HkdfSha256(Hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"),
                        Hex("000102030405060708090a0b0c"), Hex("f0f1f2f3f4f5f6f7f8f9"), 42);
  ASSERT_TRUE(okm.ok()) << okm.status();
  EXPECT_EQ(ToHex(*okm),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  EXPECT_THAT(HkdfSha256("", "", "", 32).status().message(), HasSubstr("empty key material"));
  EXPECT_THAT(HkdfSha256("k", "", "", 8161).status().message(), HasSubstr("1 to 8160"));
}

TEST(ChaCha20Test, Rfc8439BlockFunctionKeystream) {
  // RFC 8439 §2.3.2: key 00 01 .. 1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00, block counter 1.
  std::string key;
  for (int i = 0; i < 32; ++i) key.push_back(static_cast<char>(i));
  const std::string nonce = Hex("000000090000004a00000000");
  auto stream = ChaCha20Keystream(key, nonce, 1, 64);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(ToHex(*stream),
            "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
            "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e");
  // Pieces of any size continue the same stream.
  auto whole = ChaCha20Keystream(key, nonce, 0, 300);
  auto pieces = ChaCha20Stream::Create(key, nonce, 0);
  ASSERT_TRUE(whole.ok() && pieces.ok());
  std::vector<uint8_t> buf(300);
  for (auto [start, size] : {std::pair<size_t, size_t>{0, 7}, {7, 57}, {64, 0}, {64, 236}}) {
    ASSERT_TRUE(pieces->Next(absl::MakeSpan(buf.data() + start, size)).ok());
  }
  EXPECT_EQ(std::string(buf.begin(), buf.end()), *whole);
  EXPECT_EQ(whole->substr(64, 64), *stream);  // block 1 of the stream from block 0
  EXPECT_THAT(ChaCha20Keystream(key, "short", 0, 1).status().message(),
              HasSubstr("ChaCha20 nonce must be 12 bytes"));
}

TEST(AeadTest, Rfc8439SealAndOpen) {
  // RFC 8439 §2.8.2.
  std::string key;
  for (int i = 0x80; i < 0xa0; ++i) key.push_back(static_cast<char>(i));
  const std::string nonce = Hex("070000004041424344454647");
  const std::string aad = Hex("50515253c0c1c2c3c4c5c6c7");
  const std::string plaintext =
      "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the "
      "future, sunscreen would be it.";
  auto sealed = AeadSeal(key, nonce, plaintext, aad);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_EQ(sealed->size(), plaintext.size() + kAeadTagSize);
  EXPECT_EQ(ToHex(sealed->substr(0, 16)), "d31a8d34648e60db7b86afbc53ef7ec2");
  EXPECT_EQ(ToHex(sealed->substr(plaintext.size())), "1ae10b594f09e26a7e902ecbd0600691");
  auto opened = AeadOpen(key, nonce, *sealed, aad);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, plaintext);
}

TEST(AeadTest, TamperingOrTheWrongKeyFailsToOpen) {
  const std::string key = *RandomBytes(kAeadKeySize);
  const std::string share = "a Shamir share for peer 4";
  const std::string aad = "task 7 round 3 from peer 2 to peer 4";
  auto sealed = AeadSealRandomNonce(key, share, aad);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(*AeadOpenPrefixedNonce(key, *sealed, aad), share);
  // Every single-bit flip anywhere (nonce, ciphertext, tag) is caught.
  for (size_t i = 0; i < sealed->size(); ++i) {
    std::string altered = *sealed;
    altered[i] = static_cast<char>(altered[i] ^ 0x01);
    auto opened = AeadOpenPrefixedNonce(key, altered, aad);
    ASSERT_FALSE(opened.ok()) << "flip at byte " << i;
    EXPECT_THAT(opened.status().message(), HasSubstr("does not authenticate"));
  }
  // A relay that re-addresses the share (other associated data) is caught too.
  EXPECT_FALSE(AeadOpenPrefixedNonce(key, *sealed, "task 7 round 3 from peer 2 to peer 5").ok());
  EXPECT_FALSE(AeadOpenPrefixedNonce(*RandomBytes(kAeadKeySize), *sealed, aad).ok());
  EXPECT_THAT(AeadOpenPrefixedNonce(key, sealed->substr(0, 20), aad).status().message(),
              HasSubstr("shorter than"));
  // Two seals of one message differ (fresh nonces).
  EXPECT_NE(*sealed, *AeadSealRandomNonce(key, share, aad));
  EXPECT_THAT(AeadSeal("k", std::string(12, '\0'), "", "").status().message(),
              HasSubstr("ChaCha20-Poly1305 key must be 32 bytes"));
  // Empty plaintext and associated data still authenticate.
  auto empty = AeadSealRandomNonce(key, "", "");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*AeadOpenPrefixedNonce(key, *empty, ""), "");
}

TEST(Ed25519Test, Rfc8032Test1) {
  // RFC 8032 §7.1, TEST 1 (empty message).
  auto pair = Ed25519KeyPairFromPrivateKey(
      Hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"));
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(ToHex(pair->public_key),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
  auto signature = Ed25519Sign(pair->private_key, "");
  ASSERT_TRUE(signature.ok()) << signature.status();
  EXPECT_EQ(ToHex(*signature),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e"
            "39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
  EXPECT_TRUE(Ed25519Verify(pair->public_key, "", *signature).ok());
}

TEST(Ed25519Test, WrongKeyMessageOrSignatureFailsToVerify) {
  auto signer = GenerateEd25519KeyPair();
  auto other = GenerateEd25519KeyPair();
  ASSERT_TRUE(signer.ok() && other.ok());
  // What a peer signs to bind its advertised keys to its identity.
  const std::string advert = "peer-3 x25519 " + std::string(32, 'k');
  auto signature = Ed25519Sign(signer->private_key, advert);
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(Ed25519Verify(signer->public_key, advert, *signature).ok());
  EXPECT_THAT(Ed25519Verify(other->public_key, advert, *signature).message(),
              HasSubstr("does not verify"));
  std::string substituted = advert;
  substituted.back() = 'j';
  EXPECT_FALSE(Ed25519Verify(signer->public_key, substituted, *signature).ok());
  std::string forged = *signature;
  forged[10] = static_cast<char>(forged[10] ^ 0x20);
  EXPECT_FALSE(Ed25519Verify(signer->public_key, advert, forged).ok());
  EXPECT_THAT(Ed25519Verify(signer->public_key, advert, "short").message(),
              HasSubstr("Ed25519 signature must be 64 bytes"));
  EXPECT_THAT(Ed25519Sign("short", advert).status().message(),
              HasSubstr("Ed25519 private key must be 32 bytes"));
}

}  // namespace
}  // namespace shoal::privacy
