#pragma once

// A coordinator's hold on its etcd key prefix: one key, <prefix>/owner, put under a lease that a
// thread renews every third of the lease's TTL (from the lease's last renewal: the key is taken
// with a renewal, so that the hold starts with a whole TTL). Only one coordinator writes under a
// prefix:
// - A second one waits for the key (a crashed holder's lease lapses within the TTL) and takes
//   it over, or gives up after `wait` naming the holder. With an infinite `wait` it is a
//   standby: it waits as long as the key is held, and takes over as soon as the key goes.
// - A holder cut off from etcd, or paused, past its TTL has lost the key: every write of its
//   store is fenced on the key's lease (etcd::Fence), so it writes nothing more, and its next
//   renewal reports the loss through `on_lost`, once, so that the coordinator steps down.
// Thread-safe.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/etcd/etcd_kv.h"

namespace shoal::coordinator {

struct StoreLeaseOptions {
  absl::Duration ttl = absl::Seconds(10);
  // How long Acquire waits for another holder's key to go: by default a TTL and a half;
  // infinite: a standby's wait, with a log line every TTL.
  absl::Duration wait = absl::ZeroDuration();
  // What the key holds: who this is, for the messages of whoever waits for it.
  std::string identity;
  // Called from Acquire with what the key holds whenever another holder is seen.
  std::function<void(const std::string& holder)> on_held;
  // True when `holder` is an earlier process of this very coordinator, gone without letting go
  // (a restart after a crash). Acquire waits for such a holder's lease without `wait`'s
  // deadline: it lapses a TTL after its last renewal, and each etcd leader election renews
  // every lease once more, so a crash beside an election can outlast a TTL and a half. Null:
  // every holder is another coordinator.
  std::function<bool(const std::string& holder)> earlier_self;
  // When notified, Acquire stops waiting (CANCELLED). Not owned; may be null.
  const absl::Notification* stop = nullptr;
  // What the error of a wait that gave up tells the operator to do.
  std::string conflict =
      "one coordinator per key prefix (stop it, or give this one another prefix)";
  // Called once, from the renewing thread, when the hold is lost.
  std::function<void(const absl::Status&)> on_lost;
};

class StoreLease {
 public:
  // Errors: FAILED_PRECONDITION when another holder kept the key for `wait`, naming it;
  // CANCELLED when `stop` was notified first; etcd's errors (UNAVAILABLE) otherwise.
  static absl::StatusOr<std::unique_ptr<StoreLease>> Acquire(etcd::EtcdKv& kv, std::string key,
                                                             StoreLeaseOptions options);
  // Stops renewing and revokes the lease, which lets the next coordinator in at once.
  ~StoreLease();

  const etcd::Fence& fence() const { return fence_; }
  bool lost() const;

 private:
  // `renewed`: when etcd last renewed (or granted) the lease, as far as Acquire knows.
  StoreLease(etcd::EtcdKv& kv, etcd::Fence fence, StoreLeaseOptions options, absl::Time renewed);
  void RenewLoop(absl::Time renewed);

  etcd::EtcdKv& kv_;
  const etcd::Fence fence_;
  const StoreLeaseOptions options_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::thread renewer_;
};

}  // namespace shoal::coordinator
