// Signed peer announcements read from the DHT (libs/discovery): verify against a fixed CA. An
// announcement that verifies names a peer, a task and an address; every error must be clean.
// The seed (corpus/signed_announcement/) is peer-0's announcement for task "t", signed with a
// key of this CA (scripts/gen-certs; protoc --encode and openssl dgst -sha256 -sign).

#include <cstddef>
#include <cstdint>
#include <string>

#include "libs/discovery/announcement.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr char kCa[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBhjCCAS2gAwIBAgIUFXEpZkbvi3YOd3fdJHO0cMl7AkAwCgYIKoZIzj0EAwIw\n"
    "GTEXMBUGA1UEAwwOc2hvYWwtbG9jYWwtY2EwHhcNMjYxMjAzMTIyOTE2WhcNMzYx\n"
    "MTMwMTIyOTE2WjAZMRcwFQYDVQQDDA5zaG9hbC1sb2NhbC1jYTBZMBMGByqGSM49\n"
    "AgEGCCqGSM49AwEHA0IABEO5tjux1Byv6lEQkDo9DHF5NeGP2h2+q6/kuZGRjgij\n"
    "VXtSqd+48SxMUlbp8H8xW1NgFhfdfW8TYHWOhGs7OECjUzBRMB0GA1UdDgQWBBRb\n"
    "XoP1DJYnRjXS4ztnuVILKVe+bzAfBgNVHSMEGDAWgBRbXoP1DJYnRjXS4ztnuVIL\n"
    "KVe+bzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIG8K8wWX2Q7u\n"
    "EROAgP0yl38plehbFx4Zp4N9Dec4rHksAiAn6xNOo6RTzX3sLbYU+zenwsZNt1fs\n"
    "GYdL+oRTVNZkPw==\n"
    "-----END CERTIFICATE-----\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const shoal::discovery::AnnouncementVerifier* verifier = [] {
    auto v = shoal::discovery::AnnouncementVerifier::Create(kCa);
    SHOAL_FUZZ_CHECK(v.ok());
    return new shoal::discovery::AnnouncementVerifier(*v);
  }();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto announcement = verifier->Verify(bytes, "t");
  shoal::fuzz::CheckErrorIsClean(announcement.status());
  if (!announcement.ok()) return 0;
  SHOAL_FUZZ_CHECK(announcement->task() == "t");
  SHOAL_FUZZ_CHECK(!announcement->peer_id().empty());
  SHOAL_FUZZ_CHECK(!announcement->address().empty());
  return 0;
}
