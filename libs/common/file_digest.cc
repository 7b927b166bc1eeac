#include "libs/common/file_digest.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal {

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  const std::string shown = EscapeBytes(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(shown, ": no such file"));
    return absl::FailedPreconditionError(
        absl::StrCat(shown, ": cannot open: ", std::strerror(err)));
  }
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("OpenSSL: cannot start a SHA-256 digest");
  }
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const std::streamsize got = in.gcount();
    if (got > 0 && EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(got)) != 1) {
      return absl::InternalError("OpenSSL: SHA-256 update failed");
    }
  }
  if (in.bad()) {
    // Reading a directory fails here (EISDIR) rather than at open.
    return absl::FailedPreconditionError(
        absl::StrCat(shown, ": cannot read: ", std::strerror(errno)));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &size) != 1) {
    return absl::InternalError("OpenSSL: SHA-256 final failed");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(size)));
}

bool IsSha256Hex(absl::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace shoal
