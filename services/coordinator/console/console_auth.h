#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal::coordinator::console {

// What a console user may do: a viewer reads; an admin also creates and stops tasks.
enum class Role { kViewer, kAdmin };

const char* RoleName(Role role);

// The tokens of --console-tokens: one `ROLE TOKEN` per line (ROLE admin or viewer, TOKEN at
// least 16 characters of printable ASCII, no spaces), `#` comments and blank lines ignored.
// Tokens are kept as SHA-256 digests and compared in constant time.
class TokenTable {
 public:
  // Errors name the file and the line: INVALID_ARGUMENT "--console-tokens: FILE:3: ...";
  // NOT_FOUND when the file cannot be read.
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, const std::string& path);

  // The role of `token`, or nullopt. Every entry is compared (CRYPTO_memcmp of digests), so the
  // time taken says nothing about which token is close or how many there are before it.
  std::optional<Role> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string digest;  // SHA-256 of the token
    Role role;
  };
  std::vector<Entry> entries_;
};

// Browser sessions: a random id (32 bytes from RAND_bytes, hex) given in a cookie after a login,
// mapped to its role here. Ids are kept as SHA-256 digests. Thread-safe.
class SessionTable {
 public:
  explicit SessionTable(absl::Duration ttl = absl::Hours(12), size_t max_sessions = 10000);

  // A new session for `role`; returns its id. The oldest session goes when the table is full.
  absl::StatusOr<std::string> Create(Role role);
  std::optional<Role> Find(absl::string_view id);
  void Remove(absl::string_view id);

 private:
  struct Session {
    Role role;
    absl::Time expires;
  };
  const absl::Duration ttl_;
  const size_t max_sessions_;
  absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);  // by digest of the id
};

}  // namespace shoal::coordinator::console
