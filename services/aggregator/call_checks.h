#pragma once

// What the AggregatorService handlers (aggregator_service*.cc) check and answer alike.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/escape.h"
#include "libs/rpc/tls.h"

namespace shoal::aggregator {

// The answer to a call whose work the executor has no room for.
inline grpc::Status Busy() {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "aggregator is busy (work queue full); retry later");
}

// How long a call may spend on the calls it makes to a parent aggregator: the caller's deadline,
// at most 5 minutes.
inline absl::Time CallDeadline(const grpc::CallbackServerContext& context) {
  return std::min(absl::FromChrono(context.deadline()), absl::Now() + absl::Minutes(5));
}

// OK for the coordinator (plaintext, or its certificate); PERMISSION_DENIED naming the caller.
inline absl::Status CheckCoordinator(grpc::CallbackServerContext& context) {
  const std::string caller = rpc::CallerIdentity(context);
  if (caller.empty() || caller == "coordinator") return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("only the coordinator may call this; the caller's certificate is for '",
                   EscapeBytes(caller), "'"));
}

}  // namespace shoal::aggregator
