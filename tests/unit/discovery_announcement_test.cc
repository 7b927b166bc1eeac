// Signed peer announcements (libs/discovery): only an announcement signed with the key of a
// certificate the task's CA issued, for the peer id that certificate names, is accepted;
// unsigned, wrongly signed, foreign-CA and other-task announcements are ignored by the member
// book. Certificates come from scripts/gen-certs (the openssl CLI), as in deployments.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/discovery/announcement.h"
#include "libs/discovery/member_book.h"
#include "services/shoalctl/process.h"
#include "tests/testing/temp_dir.h"

namespace shoal::discovery {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Identity {
  std::string ca, cert, key;
};

class AnnouncementTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = testing::MakeTestTempDir("shoal-announcement-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = new std::string(*dir);
    Gen("certs", {"peer-0", "peer-1"});
    Gen("rogue", {"peer-0"});  // the same name from another CA
  }
  static void TearDownTestSuite() { delete dir_; }

  static void Gen(const std::string& out, const std::vector<std::string>& names) {
    const char* source = std::getenv("SHOAL_SOURCE_DIR");
    process::ProcessOptions gen;
    gen.name = "gen-certs";
    gen.binary = absl::StrCat(source != nullptr ? source : ".", "/scripts/gen-certs");
    gen.args = {*dir_ + "/" + out};
    gen.args.insert(gen.args.end(), names.begin(), names.end());
    gen.log_path = *dir_ + "/" + out + ".log";
    auto proc = process::Process::Start(gen);
    ASSERT_TRUE(proc.ok()) << proc.status();
    auto exit = (*proc)->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok() && exit->success()) << (*proc)->LogTail(10);
  }

  static Identity Load(const std::string& path) {
    const std::string d = *dir_ + "/" + path;
    return {ReadFile(d + "/ca.crt"), ReadFile(d + "/tls.crt"), ReadFile(d + "/tls.key")};
  }

  static AnnouncementSigner Signer(const std::string& path) {
    Identity id = Load(path);
    auto signer = AnnouncementSigner::Create(id.cert, id.key);
    EXPECT_TRUE(signer.ok()) << signer.status();
    return *signer;
  }

  static AnnouncementVerifier Verifier() {
    auto verifier = AnnouncementVerifier::Create(Load("certs/peer-1").ca);
    EXPECT_TRUE(verifier.ok()) << verifier.status();
    return *verifier;
  }

  static peer::v1::PeerAnnouncement Announcement(const std::string& peer,
                                                 const std::string& address, int64_t issued,
                                                 const std::string& task = "t") {
    peer::v1::PeerAnnouncement a;
    a.set_task(task);
    a.set_peer_id(peer);
    a.set_address(address);
    a.set_issued_unix_ms(issued);
    return a;
  }

  static std::string Signed(const std::string& path, const peer::v1::PeerAnnouncement& a) {
    auto bytes = Signer(path).Sign(a);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : "";
  }

  static std::string* dir_;
};

std::string* AnnouncementTest::dir_ = nullptr;

TEST_F(AnnouncementTest, SignedByTheTasksCaIsAccepted) {
  AnnouncementSigner signer = Signer("certs/peer-0");
  EXPECT_EQ(signer.peer_id(), "peer-0");
  const std::string bytes = Signed("certs/peer-0", Announcement("peer-0", "127.0.0.1:5000", 7));
  auto a = Verifier().Verify(bytes, "t");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->peer_id(), "peer-0");
  EXPECT_EQ(a->address(), "127.0.0.1:5000");
  EXPECT_EQ(a->issued_unix_ms(), 7);
}

TEST_F(AnnouncementTest, UnsignedIsRefused) {
  peer::v1::SignedAnnouncement s;
  ASSERT_TRUE(s.ParseFromString(Signed("certs/peer-0", Announcement("peer-0", "h:1", 1))));
  s.clear_signature();
  auto a = Verifier().Verify(s.SerializeAsString(), "t");
  EXPECT_THAT(a.status().message(), HasSubstr("not signed"));
  // Nor is a bare PeerAnnouncement, or noise.
  EXPECT_FALSE(Verifier().Verify(Announcement("peer-0", "h:1", 1).SerializeAsString(), "t").ok());
  EXPECT_FALSE(Verifier().Verify("\xff\xff\xff garbage", "t").ok());
  EXPECT_THAT(
      Verifier().Verify(std::string(kMaxSignedAnnouncementBytes + 1, 'x'), "t").status().message(),
      HasSubstr("limit"));
}

TEST_F(AnnouncementTest, WronglySignedIsRefused) {
  // Altered after signing: the address of an attacker, the signature of the real peer.
  peer::v1::SignedAnnouncement s;
  ASSERT_TRUE(s.ParseFromString(Signed("certs/peer-0", Announcement("peer-0", "h:1", 1))));
  s.set_announcement(Announcement("peer-0", "evil:1", 1).SerializeAsString());
  EXPECT_THAT(Verifier().Verify(s.SerializeAsString(), "t").status().message(),
              HasSubstr("signature does not verify"));
  // peer-1's genuine certificate and signature over a claim to be peer-0: the signature is
  // peer-1's over other bytes.
  peer::v1::SignedAnnouncement other;
  ASSERT_TRUE(other.ParseFromString(Signed("certs/peer-1", Announcement("peer-1", "h:2", 1))));
  other.set_announcement(Announcement("peer-0", "h:2", 1).SerializeAsString());
  EXPECT_FALSE(Verifier().Verify(other.SerializeAsString(), "t").ok());
  // A signature by another key under peer-0's certificate.
  peer::v1::SignedAnnouncement swapped = s;
  ASSERT_TRUE(swapped.ParseFromString(Signed("certs/peer-0", Announcement("peer-0", "h:1", 1))));
  swapped.set_signature(other.signature());
  EXPECT_THAT(Verifier().Verify(swapped.SerializeAsString(), "t").status().message(),
              HasSubstr("signature does not verify"));
}

TEST_F(AnnouncementTest, CertificateOfAnotherCaIsRefused) {
  const std::string bytes = Signed("rogue/peer-0", Announcement("peer-0", "evil:1", 99));
  EXPECT_THAT(Verifier().Verify(bytes, "t").status().message(), HasSubstr("not trusted"));
}

TEST_F(AnnouncementTest, OtherTaskIsRefused) {
  const std::string bytes = Signed("certs/peer-0", Announcement("peer-0", "h:1", 1, "other"));
  EXPECT_THAT(Verifier().Verify(bytes, "t").status().message(), HasSubstr("for task"));
}

TEST_F(AnnouncementTest, SignerChecksItsKeyAndPeerId) {
  Identity mine = Load("certs/peer-0");
  Identity theirs = Load("certs/peer-1");
  EXPECT_THAT(AnnouncementSigner::Create(mine.cert, theirs.key).status().message(),
              HasSubstr("does not belong"));
  EXPECT_FALSE(AnnouncementSigner::Create("no pem", mine.key).ok());
  EXPECT_FALSE(AnnouncementVerifier::Create("no pem").ok());
  EXPECT_THAT(Signer("certs/peer-0").Sign(Announcement("peer-1", "h:1", 1)).status().message(),
              HasSubstr("not the certificate's"));
}

TEST_F(AnnouncementTest, MemberBookIgnoresWhatDoesNotVerify) {
  MemberBook book(Verifier(), "t", Member{"peer-1", "self:1"});
  EXPECT_THAT(book.Members(), ElementsAre(Member{"peer-1", "self:1"}));

  const std::string real = Signed("certs/peer-0", Announcement("peer-0", "real:1", 10));
  auto added = book.Add(real);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_TRUE(*added);
  // The impostor, newer, from another CA: refused, the real address stays.
  EXPECT_FALSE(book.Add(Signed("rogue/peer-0", Announcement("peer-0", "evil:1", 99))).ok());
  peer::v1::SignedAnnouncement unsigned_one;
  ASSERT_TRUE(unsigned_one.ParseFromString(real));
  unsigned_one.clear_signature();
  EXPECT_FALSE(book.Add(unsigned_one.SerializeAsString()).ok());
  EXPECT_FALSE(book.Remove(Signed("rogue/peer-0", Announcement("peer-0", "real:1", 10))));
  EXPECT_THAT(book.Members(), ElementsAre(Member{"peer-1", "self:1"}, Member{"peer-0", "real:1"}));

  // An older announcement of the same peer changes nothing; a newer one moves it.
  const std::string old = Signed("certs/peer-0", Announcement("peer-0", "old:1", 5));
  EXPECT_FALSE(*book.Add(old));
  const std::string moved = Signed("certs/peer-0", Announcement("peer-0", "moved:1", 20));
  EXPECT_TRUE(*book.Add(moved));
  EXPECT_THAT(book.Members(), ElementsAre(Member{"peer-1", "self:1"}, Member{"peer-0", "moved:1"}));
  // Its own announcement, read back from the DHT, is not another member.
  EXPECT_FALSE(*book.Add(Signed("certs/peer-1", Announcement("peer-1", "self:1", 30))));
  // The replaced value expiring changes nothing; the current one's expiry removes the peer.
  EXPECT_FALSE(book.Remove(real));
  EXPECT_TRUE(book.Remove(moved));
  EXPECT_THAT(book.Members(), ElementsAre(Member{"peer-1", "self:1"}));
}

}  // namespace
}  // namespace shoal::discovery
