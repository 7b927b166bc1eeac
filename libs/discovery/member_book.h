#pragma once

// The members of one task as signed announcements tell them (announcement.h): only
// announcements that verify against the task's CA count; per peer id the newest wins.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/discovery/announcement.h"
#include "libs/discovery/discovery.h"

namespace shoal::discovery {

// Not thread-safe (DhtDiscovery guards it).
class MemberBook {
 public:
  MemberBook(AnnouncementVerifier verifier, std::string task, Member self)
      : verifier_(std::move(verifier)), task_(std::move(task)), self_(std::move(self)) {}

  // Records a stored value. Returns whether the member list changed (false for an announcement
  // older than the one held, or this peer's own). Errors: Verify's, and then nothing changes.
  absl::StatusOr<bool> Add(absl::string_view signed_announcement);
  // A value expired: its peer leaves unless a newer announcement replaced it. Returns whether
  // the list changed; a value that does not verify changes nothing.
  bool Remove(absl::string_view signed_announcement);

  // This peer first, then the others by peer id.
  std::vector<Member> Members() const;

 private:
  struct Entry {
    std::string address;
    int64_t issued_unix_ms = 0;
  };
  AnnouncementVerifier verifier_;
  std::string task_;
  Member self_;
  std::map<std::string, Entry> others_;
};

}  // namespace shoal::discovery
