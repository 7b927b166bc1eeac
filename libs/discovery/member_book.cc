#include "libs/discovery/member_book.h"

#include <utility>

namespace shoal::discovery {

absl::StatusOr<bool> MemberBook::Add(absl::string_view signed_announcement) {
  absl::StatusOr<peer::v1::PeerAnnouncement> a = verifier_.Verify(signed_announcement, task_);
  if (!a.ok()) return a.status();
  if (a->peer_id() == self_.peer_id) return false;
  auto [it, inserted] = others_.try_emplace(a->peer_id());
  if (!inserted && it->second.issued_unix_ms >= a->issued_unix_ms()) return false;
  const bool changed = inserted || it->second.address != a->address();
  it->second = Entry{a->address(), a->issued_unix_ms()};
  return changed;
}

bool MemberBook::Remove(absl::string_view signed_announcement) {
  absl::StatusOr<peer::v1::PeerAnnouncement> a = verifier_.Verify(signed_announcement, task_);
  if (!a.ok()) return false;
  auto it = others_.find(a->peer_id());
  if (it == others_.end() || it->second.issued_unix_ms != a->issued_unix_ms()) return false;
  others_.erase(it);
  return true;
}

std::vector<Member> MemberBook::Members() const {
  std::vector<Member> members = {self_};
  for (const auto& [id, entry] : others_) members.push_back(Member{id, entry.address});
  return members;
}

}  // namespace shoal::discovery
