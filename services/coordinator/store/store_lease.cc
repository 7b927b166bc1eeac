#include "services/coordinator/store/store_lease.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/log.h"

namespace shoal::coordinator {

absl::StatusOr<std::unique_ptr<StoreLease>> StoreLease::Acquire(etcd::EtcdKv& kv, std::string key,
                                                                StoreLeaseOptions options) {
  if (options.wait == absl::ZeroDuration()) options.wait = options.ttl * 3 / 2;
  absl::StatusOr<int64_t> lease = kv.GrantLease(options.ttl);
  if (!lease.ok()) return lease.status();
  const absl::Time deadline = absl::Now() + options.wait;
  bool told = false;
  while (true) {
    absl::StatusOr<std::string> holder = kv.CreateIfAbsent(key, options.identity, *lease);
    if (holder.ok() && *holder == options.identity) break;
    if (!holder.ok() && holder.status().code() != absl::StatusCode::kUnavailable) {
      return holder.status();
    }
    if (absl::Now() >= deadline) {
      kv.RevokeLease(*lease).IgnoreError();
      return absl::FailedPreconditionError(
          absl::StrCat(key, " is held by another coordinator (",
                       holder.ok() ? *holder : holder.status().ToString(), ") after waiting ",
                       absl::FormatDuration(options.wait),
                       ": one coordinator per key prefix (stop it, or give this one another "
                       "prefix)"));
    }
    if (!told && holder.ok()) {
      LogInfo("store: ", key, " is held by ", *holder, "; waiting up to ",
              absl::FormatDuration(options.wait), " for its lease to lapse");
      told = true;
    }
    // Our own lease must outlive the wait.
    if (absl::StatusOr<absl::Duration> renewed = kv.KeepAlive(*lease); !renewed.ok()) {
      return renewed.status();
    }
    absl::SleepFor(std::min(options.ttl / 5, absl::Milliseconds(500)));
  }
  return std::unique_ptr<StoreLease>(
      new StoreLease(kv, etcd::Fence{std::move(key), *lease}, std::move(options)));
}

StoreLease::StoreLease(etcd::EtcdKv& kv, etcd::Fence fence, StoreLeaseOptions options)
    : kv_(kv), fence_(std::move(fence)), options_(std::move(options)) {
  renewer_ = std::thread([this] { RenewLoop(); });
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

void StoreLease::RenewLoop() {
  absl::Time renewed = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.ttl / 3)) return;
    }
    absl::StatusOr<absl::Duration> ttl = kv_.KeepAlive(fence_.lease);
    const absl::Time now = absl::Now();
    absl::Status loss;
    if (ttl.ok()) {
      renewed = now;
      continue;
    }
    if (ttl.status().code() == absl::StatusCode::kNotFound) {
      loss = ttl.status();
    } else if (now - renewed >= options_.ttl) {
      // Unreachable for a whole TTL: etcd has let the lease go by now.
      loss = absl::UnavailableError(absl::StrCat("no renewal of the hold on ", fence_.key, " for ",
                                                 absl::FormatDuration(now - renewed), ": ",
                                                 ttl.status().message()));
    } else {
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
