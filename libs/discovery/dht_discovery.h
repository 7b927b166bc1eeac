#pragma once

// Discovery through a Kademlia DHT (OpenDHT; the only file that uses it). Every peer of a task
// runs a DHT node on its own UDP port, joins the DHT through any one node already in it
// (--dht-bootstrap), stores its signed announcement under the key SHA-1("shoal/gossip/" + task)
// and listens on that key. Announcements that do not verify against the task's CA are ignored
// (member_book.h). The DHT is a private one: its network id keeps it apart from OpenDHT's
// public network.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/discovery/announcement.h"
#include "libs/discovery/discovery.h"
#include "libs/discovery/member_book.h"

namespace dht {
class DhtRunner;
}

namespace shoal::discovery {

struct DhtOptions {
  std::string listen;                  // --dht-listen HOST:PORT (UDP; port 0: any free port)
  std::vector<std::string> bootstrap;  // --dht-bootstrap HOST:PORT,...: nodes already in the DHT
  std::string task;                    // the task's name: the DHT key
};

// Owned by the static gossip peer; thread-safe.
class DhtDiscovery final : public Discovery {
 public:
  // Binds the DHT's UDP socket and starts joining through the bootstrap nodes (in the
  // background: a bootstrap node that is not up yet is retried). Errors: INVALID_ARGUMENT naming
  // --dht-listen or --dht-bootstrap; UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<DhtDiscovery>> Create(const DhtOptions& options,
                                                              AnnouncementSigner signer,
                                                              AnnouncementVerifier verifier);
  ~DhtDiscovery() override;

  // HOST:PORT the DHT node is bound to: what other peers pass as --dht-bootstrap.
  const std::string& address() const { return address_; }

  // Stores the signed announcement of `self` (kept stored until Stop) and listens for the
  // others'. Errors: INVALID_ARGUMENT when self's peer id is not the certificate's.
  absl::Status Start(const Member& self, MembersCallback on_change) override;
  void Stop() override;

 private:
  DhtDiscovery() = default;
  void OnValues(const std::vector<std::string>& values, bool expired) ABSL_LOCKS_EXCLUDED(mu_);

  DhtOptions options_;
  std::unique_ptr<AnnouncementSigner> signer_;
  std::unique_ptr<AnnouncementVerifier> verifier_;
  std::string address_;
  std::unique_ptr<dht::DhtRunner> runner_;

  absl::Mutex mu_;
  std::unique_ptr<MemberBook> book_ ABSL_GUARDED_BY(mu_);
  MembersCallback on_change_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::discovery
