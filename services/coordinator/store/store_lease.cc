#include "services/coordinator/store/store_lease.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"

namespace shoal::coordinator {
namespace {

// How long one etcd member may take to renew a hold before the next is asked: a third of the TTL,
// so that a member that hangs (paused, cut off with its connections open) costs a renewal, not
// the hold; but at least 2 s, so that members slow to answer on a loaded machine (TLS
// handshakes, a busy disk) are not given up on.
absl::Duration PerMember(absl::Duration ttl) { return std::max(ttl / 3, absl::Seconds(2)); }

}  // namespace

absl::StatusOr<std::unique_ptr<StoreLease>> StoreLease::Acquire(etcd::EtcdKv& kv, std::string key,
                                                                StoreLeaseOptions options) {
  if (options.wait == absl::ZeroDuration()) options.wait = options.ttl * 3 / 2;
  const bool standby = options.wait == absl::InfiniteDuration();
  absl::StatusOr<int64_t> granted = kv.GrantLease(options.ttl);
  if (!granted.ok()) return granted.status();
  int64_t lease = *granted;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.wait;
  // A free key is seen within a poll: a tenth of the TTL, at most 250 ms.
  const absl::Duration poll = std::min(options.ttl / 10, absl::Milliseconds(250));
  // When etcd last renewed (or granted) our lease, as far as we know: its TTL runs from then.
  absl::Time renewed = start;
  absl::Time warned = absl::InfinitePast();
  absl::Time told = absl::InfinitePast();
  std::string last_holder;
  while (true) {
    // Our own lease must outlive the wait; one that lapsed while etcd was out of reach is
    // granted again.
    if (const absl::Time now = absl::Now(); now - renewed >= options.ttl / 3) {
      absl::StatusOr<absl::Duration> ttl = kv.KeepAlive(lease, key, PerMember(options.ttl));
      if (ttl.ok()) {
        renewed = now;
      } else if (absl::IsNotFound(ttl.status())) {
        if (granted = kv.GrantLease(options.ttl); granted.ok()) {
          lease = *granted;
          renewed = now;
        }
      } else if (now - warned >= options.ttl / 3) {
        LogWarning("store: could not renew the lease for ", key, " while waiting for it (",
                   absl::FormatDuration(absl::Trunc(now - renewed, absl::Milliseconds(100))),
                   " since the last renewal): ", ttl.status().message());
        warned = now;
      }
    }
    absl::StatusOr<std::string> holder = kv.CreateIfAbsent(key, options.identity, lease);
    if (holder.ok() && *holder == options.identity) {
      // The key is ours under a lease that may be near its end (renewals failed while etcd
      // elected a leader, or the last one was a third of a TTL ago): renew it now, so that the
      // hold starts with a whole TTL; a renewal that fails here is the renewing thread's to
      // retry, from the last one that worked.
      const absl::Time now = absl::Now();
      if (kv.KeepAlive(lease, key, PerMember(options.ttl)).ok()) renewed = now;
      break;
    }
    if (!holder.ok() && holder.status().code() != absl::StatusCode::kUnavailable &&
        holder.status().code() != absl::StatusCode::kNotFound) {
      kv.RevokeLease(lease).IgnoreError();
      return holder.status();
    }
    const absl::Time now = absl::Now();
    const bool earlier_self = holder.ok() && options.earlier_self && options.earlier_self(*holder);
    if (now >= deadline && !earlier_self) {
      kv.RevokeLease(lease).IgnoreError();
      return absl::FailedPreconditionError(
          absl::StrCat(key, " is held by another coordinator (",
                       holder.ok() ? *holder : holder.status().ToString(), ") after waiting ",
                       absl::FormatDuration(options.wait), ": ", options.conflict));
    }
    if (holder.ok()) {
      if (*holder != last_holder && options.on_held) options.on_held(*holder);
      if (earlier_self) {
        if (now - told >= options.ttl) {
          LogInfo("store: ", key, " is held by this coordinator's earlier process (", *holder,
                  "), which is gone; waiting for its lease to lapse (",
                  absl::ToInt64Seconds(now - start), " s so far)");
          told = now;
        }
      } else if (standby && now - told >= options.ttl) {
        LogInfo("standby: ", *holder, " holds ", key, "; waiting (",
                absl::ToInt64Seconds(now - start), " s so far)");
        told = now;
      } else if (!standby && told == absl::InfinitePast()) {
        LogInfo("store: ", key, " is held by ", *holder, "; waiting up to ",
                absl::FormatDuration(options.wait), " for its lease to lapse");
        told = now;
      }
      last_holder = *holder;
    }
    const bool stopped = options.stop != nullptr
                             ? options.stop->WaitForNotificationWithTimeout(poll)
                             : (absl::SleepFor(poll), false);
    if (stopped) {
      kv.RevokeLease(lease).IgnoreError();
      return absl::CancelledError(absl::StrCat("stopped while waiting for ", key));
    }
  }
  return std::unique_ptr<StoreLease>(
      new StoreLease(kv, etcd::Fence{std::move(key), lease}, std::move(options), renewed));
}

StoreLease::StoreLease(etcd::EtcdKv& kv, etcd::Fence fence, StoreLeaseOptions options,
                       absl::Time renewed)
    : kv_(kv), fence_(std::move(fence)), options_(std::move(options)) {
  renewer_ = std::thread([this, renewed] { RenewLoop(renewed); });
}

StoreLease::~StoreLease() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  renewer_.join();
  if (!lost()) kv_.RevokeLease(fence_.lease).IgnoreError();
}

bool StoreLease::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

void StoreLease::RenewLoop(absl::Time renewed) {
  // A renewal every third of the TTL from the last one that worked; after one that failed, the
  // next within a tenth of the TTL, so that a lease with little time left gets several tries.
  absl::Time next = renewed + options_.ttl / 3;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), next)) return;
    }
    const absl::Time asked = absl::Now();
    absl::StatusOr<absl::Duration> ttl =
        kv_.KeepAlive(fence_.lease, fence_.key, PerMember(options_.ttl));
    const absl::Time now = absl::Now();
    absl::Status loss;
    if (ttl.ok()) {
      renewed = asked;
      next = renewed + options_.ttl / 3;
      continue;
    }
    next = now + options_.ttl / 10;
    if (ttl.status().code() == absl::StatusCode::kNotFound) {
      loss = ttl.status();
    } else if (now - renewed >= options_.ttl) {
      // Unreachable for a whole TTL: etcd has let the lease go by now.
      loss = absl::UnavailableError(absl::StrCat("no renewal of the hold on ", fence_.key, " for ",
                                                 absl::FormatDuration(now - renewed), ": ",
                                                 ttl.status().message()));
    } else {
      // Said each time (at most ten times a TTL), so that a hold lost later shows why.
      LogWarning("store: could not renew the hold on ", fence_.key, " (",
                 absl::FormatDuration(absl::Trunc(now - renewed, absl::Milliseconds(100))),
                 " since the last renewal, ", absl::FormatDuration(options_.ttl),
                 " allowed): ", ttl.status().message());
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      lost_ = true;
    }
    if (options_.on_lost) {
      options_.on_lost(absl::FailedPreconditionError(
          absl::StrCat("lost the hold on ", fence_.key, ": ", loss.message())));
    }
    return;
  }
}

}  // namespace shoal::coordinator
