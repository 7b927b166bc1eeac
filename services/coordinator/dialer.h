#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shoal::coordinator {

// How the coordinator checks that it can open a connection to a node's advertised address (the
// reachability in its Capacity): services/coordinator/grpc_dialer.h over gRPC's health service;
// tests pass fakes. Thread-safe.
class Dialer {
 public:
  virtual ~Dialer() = default;
  // OK when a server at `address` answered before `deadline`; UNAVAILABLE or
  // DEADLINE_EXCEEDED (with the reason) when none did.
  virtual absl::Status Dial(const std::string& address, absl::Time deadline) = 0;
};

}  // namespace shoal::coordinator
