#include "services/coordinator/console/console_auth.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal::coordinator::console {
namespace {

constexpr size_t kMinTokenLength = 16;

std::string Sha256(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

bool PrintableNoSpace(absl::string_view s) {
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "viewer"; }

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--console-tokens: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, const std::string& path) {
  TokenTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--console-tokens: ", path, ":", line_number, ": ", why));
    };
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) return fail("expected `ROLE TOKEN` (ROLE admin or viewer)");
    Role role;
    if (fields[0] == "admin") {
      role = Role::kAdmin;
    } else if (fields[0] == "viewer") {
      role = Role::kViewer;
    } else {
      return fail(absl::StrCat("unknown role '", fields[0], "' (expected admin or viewer)"));
    }
    if (fields[1].size() < kMinTokenLength || !PrintableNoSpace(fields[1])) {
      return fail(absl::StrCat("the token must be at least ", kMinTokenLength,
                               " printable characters (e.g. openssl rand -hex 24)"));
    }
    std::string digest = Sha256(fields[1]);
    for (const Entry& e : table.entries_) {
      if (e.digest == digest) return fail("this token is already on an earlier line");
    }
    table.entries_.push_back({std::move(digest), role});
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--console-tokens: ", path, ": no tokens (lines `admin TOKEN`, `viewer TOKEN`)"));
  }
  return table;
}

std::optional<Role> TokenTable::Find(absl::string_view token) const {
  const std::string digest = Sha256(token);
  std::optional<Role> found;
  for (const Entry& e : entries_) {
    if (CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0) found = e.role;
  }
  return found;
}

SessionTable::SessionTable(absl::Duration ttl, size_t max_sessions)
    : ttl_(ttl), max_sessions_(max_sessions) {}

absl::StatusOr<std::string> SessionTable::Create(Role role) {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("RAND_bytes failed: no session id");
  }
  std::string id = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second.expires <= now ? sessions_.erase(it) : std::next(it);
  }
  if (sessions_.size() >= max_sessions_) {
    auto oldest = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.expires < oldest->second.expires) oldest = it;
    }
    sessions_.erase(oldest);
  }
  sessions_[Sha256(id)] = Session{role, now + ttl_};
  return id;
}

std::optional<Role> SessionTable::Find(absl::string_view id) {
  if (id.empty()) return std::nullopt;
  const std::string digest = Sha256(id);
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(digest);
  if (it == sessions_.end()) return std::nullopt;
  if (it->second.expires <= absl::Now()) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second.role;
}

void SessionTable::Remove(absl::string_view id) {
  const std::string digest = Sha256(id);
  absl::MutexLock lock(&mu_);
  sessions_.erase(digest);
}

}  // namespace shoal::coordinator::console
