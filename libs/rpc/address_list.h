#pragma once

// The addresses of a service of which one serves at a time: an active coordinator and its
// standbys (--coordinator HOST:PORT[,HOST:PORT...]). A client calls the current address and,
// when that answers UNAVAILABLE (a standby, a dead process) or a session stream on it breaks,
// moves on to the next one (MoveOn), which logs the move. Every client of the coordinator picks
// its address here: its own retry loop with MoveOn (a session, a registration), or CallAny for
// single calls. With one address nothing moves and the channel keeps gRPC's transport retries
// (libs/rpc/channel.h); with several, a refused call moves on at once instead. Thread-safe.

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/backoff.h"
#include "libs/rpc/retry.h"

namespace shoal::rpc {

class AddressList {
 public:
  // Parses "HOST:PORT[,HOST:PORT...]". Errors: INVALID_ARGUMENT naming `flag` for an empty list,
  // a malformed address or one given twice.
  static absl::StatusOr<std::vector<std::string>> Parse(absl::string_view list,
                                                        absl::string_view flag);
  // `service` names what the addresses serve in the logs ("coordinator"); null `credentials`:
  // plaintext.
  static absl::StatusOr<std::unique_ptr<AddressList>> Create(
      absl::string_view list, absl::string_view flag,
      std::shared_ptr<grpc::ChannelCredentials> credentials, std::string service);

  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;  // one per address, made once
  };
  // The address in use and its channel.
  Target Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // After `failed` (an address Current() gave) refused a call or broke a stream: the next
  // address becomes current, unless another caller moved on from `failed` already. Logs the
  // move (at most one pass over the list per 10 s). No-op with one address.
  void MoveOn(const std::string& failed, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a call's failure says that the address does not serve: UNAVAILABLE.
  static bool ShouldMoveOn(const absl::Status& status) { return absl::IsUnavailable(status); }

  const std::vector<std::string>& addresses() const { return addresses_; }
  size_t size() const { return addresses_.size(); }
  // The list as given on the command line: "HOST:PORT,HOST:PORT".
  std::string ToString() const;

 private:
  AddressList(std::vector<std::string> addresses,
              std::shared_ptr<grpc::ChannelCredentials> credentials, std::string service);

  const std::vector<std::string> addresses_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  const std::string service_;
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time log_window_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  size_t logged_ ABSL_GUARDED_BY(mu_) = 0;
};

// Paces a retry loop over an AddressList (a session, a registration): within a pass over the
// list the next address is tried at once, and the backoff is slept between passes only. So the
// standby that took over is found within one backoff of serving, however many addresses (dead,
// or standbys still refusing) come before it in the list. Not thread-safe; one per retry loop.
class PassBackoff {
 public:
  PassBackoff(BackoffOptions options, size_t addresses)
      : backoff_(options), addresses_(addresses) {}
  // The delay after a failed attempt: zero until every address has failed once in this pass,
  // then the backoff's next delay (with one address, always the backoff's).
  absl::Duration Next() {
    if (++failed_ < addresses_) return absl::ZeroDuration();
    failed_ = 0;
    return backoff_.Next();
  }
  // After a success: the next failure starts a pass, and the backoff starts again from its
  // initial delay.
  void Reset() {
    backoff_.Reset();
    failed_ = 0;
  }

 private:
  Backoff backoff_;
  const size_t addresses_;
  size_t failed_ = 0;
};

// One call made at whichever address serves: attempt(target, deadline) at the current address,
// moving on after each UNAVAILABLE and trying again, the next address at once and each pass
// over the list after a backoff (PassBackoff, from 100 ms, capped at 1 s), until it succeeds,
// fails otherwise, `retryable` (if set) rejects the failure or `deadline` comes. With one
// address it is one attempt (its channel retries UNAVAILABLE itself, briefly), as a plain call.
// `attempt` returns absl::Status or absl::StatusOr<T>.
template <typename Attempt>
auto CallAny(AddressList& addresses, absl::Time deadline, Attempt&& attempt,
             std::function<bool(const absl::Status&)> retryable = nullptr)
    -> std::invoke_result_t<Attempt&, const AddressList::Target&, absl::Time> {
  PassBackoff backoff(BackoffOptions{absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.2},
                      addresses.size());
  while (true) {
    const AddressList::Target target = addresses.Current();
    auto result = attempt(target, deadline);
    const absl::Status& status = retry_internal::StatusOf(result);
    if (!AddressList::ShouldMoveOn(status)) return result;
    addresses.MoveOn(target.address, status.message());
    if (addresses.size() == 1 || (retryable && !retryable(status))) return result;
    const absl::Duration delay = backoff.Next();
    if (absl::Now() + delay >= deadline) return result;
    absl::SleepFor(delay);
  }
}

}  // namespace shoal::rpc
