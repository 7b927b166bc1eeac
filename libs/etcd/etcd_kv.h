#pragma once

// A client of etcd's v3 key-value API (its KV and Maintenance gRPC services, stubs generated
// from etcd's own protos). Each call goes to the member that answered last and, when that one
// is unreachable (UNAVAILABLE or DEADLINE_EXCEEDED), to the next in the list, so one lost
// member of a cluster costs a retry, not an error. A member found unreachable gets a fresh
// channel for its next call, so one that restarts is used again as soon as it listens, not after
// gRPC's reconnect backoff. Plaintext gRPC. Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace etcdserverpb {
class RequestOp;
}  // namespace etcdserverpb
namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace shoal::etcd {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t lease = 0;  // the lease the key is held under (0: none)
};

// Keys in [start, end) in key order, or the reverse with `descending`; at most `limit` of them
// (0: all).
struct RangeQuery {
  std::string start;
  std::string end;
  int64_t limit = 0;
  bool descending = false;
};

// The keys in [start, end).
struct KeyRange {
  std::string start;
  std::string end;
};

// A condition on a write: it happens only while `key` is held under `lease` (a transaction
// that compares the key's lease), so a client that lost the key writes nothing.
struct Fence {
  std::string key;
  int64_t lease = 0;
};

class EtcdKv {
 public:
  // `endpoints`: "host:port" of one or more members. Waits up to `connect_timeout` for one of
  // them to answer a status call. `credentials`: TLS to the members (they must then serve
  // https client URLs); null: plaintext. Errors: INVALID_ARGUMENT no endpoint or an empty one;
  // UNAVAILABLE when none answered, naming each endpoint and what it said.
  static absl::StatusOr<std::unique_ptr<EtcdKv>> Connect(
      std::vector<std::string> endpoints, absl::Duration connect_timeout,
      absl::Duration call_timeout, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~EtcdKv();

  // With a fence, FAILED_PRECONDITION (and nothing written) when the fence's key is not held
  // under its lease any more.
  absl::Status Put(absl::string_view key, absl::string_view value, const Fence* fence = nullptr);
  absl::StatusOr<std::vector<KeyValue>> Range(const RangeQuery& query);
  // Deletes the keys in [start, end); a fence as for Put.
  absl::Status DeleteRange(absl::string_view start, absl::string_view end,
                           const Fence* fence = nullptr);
  // Deletes the keys of every range in one transaction, guarded by `fence` as Put is.
  absl::Status DeleteRanges(const std::vector<KeyRange>& ranges, const Fence& fence);

  // Leases: a key put under a lease is deleted when the lease expires (no keep-alive within
  // its TTL) or is revoked.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews `lease`; returns its TTL. NOT_FOUND when it has expired. Each member's try takes at
  // most `per_member` (zero: the call timeout), so that a member that hangs (paused,
  // partitioned: its connection open, no answer) holds a renewal up no longer than that before
  // the next member is asked. A renewal counts only where the member then serves a
  // linearizable read of `confirm_key` (one the caller may read: the key the lease holds): a
  // leader that was paused past an election and does not yet know it was deposed renews leases
  // in its own memory alone (etcd 3.4), while the real leader lets them lapse; it cannot gather
  // the quorum such a read needs, so the next member is asked.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease, absl::string_view confirm_key,
                                           absl::Duration per_member = absl::ZeroDuration());
  absl::Status RevokeLease(int64_t lease);
  // Puts `key` = `value` under `lease` if `key` does not exist. Returns the value the key holds
  // afterwards: `value` when this call (or an earlier try of it) created it, else the holder's.
  absl::StatusOr<std::string> CreateIfAbsent(absl::string_view key, absl::string_view value,
                                             int64_t lease);
  // Puts `key` = `value` under `lease` if none of `absent` (which may name `key`) exists, in one
  // transaction. Returns whether it did.
  absl::StatusOr<bool> PutIfNoneExist(const std::vector<std::string>& absent, absl::string_view key,
                                      absl::string_view value, int64_t lease);

  // The end of the range of every key that starts with `prefix` (etcd's convention: the prefix
  // with its last byte below 0xff incremented).
  static std::string PrefixEnd(absl::string_view prefix);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct Stubs;
  struct Member;
  EtcdKv(std::vector<std::string> endpoints, absl::Duration call_timeout,
         const std::shared_ptr<grpc::ChannelCredentials>& credentials);

  // Runs `call` against the members, starting with the one that answered last, until one
  // answers or all are unreachable; the error then names every member. Each try has `timeout`
  // (zero: the call timeout).
  template <typename Call>
  absl::Status OnAnyMember(absl::string_view what, Call call,
                           absl::Duration timeout = absl::ZeroDuration());
  // Runs `ops` in one transaction guarded by `fence`.
  absl::Status FencedWrite(absl::string_view what, const Fence& fence,
                           const std::vector<etcdserverpb::RequestOp>& ops);

  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Member>> members_;
  absl::Duration call_timeout_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::etcd
