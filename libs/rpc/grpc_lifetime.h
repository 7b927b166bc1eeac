#pragma once

#include <functional>

#include "absl/time/time.h"

namespace shoal::rpc {

// The gRPC library's lifetime in a program's main(). Declare it before the first gRPC object
// (after BlockShutdownSignals(): gRPC starts threads) and end main() with
// `return grpc.Exit(code);` once the program's own objects are gone.
//
// Why: gRPC 1.51 tears the library down when its last reference goes, and that joins its
// executor thread. After any write that found a socket's buffer full, that thread may be in the
// 10 s poll of gRPC's TCP backup poller, and nothing wakes it once the connections are closed:
// a service stopped within 10 s of a large transfer took up to 10 s more to exit (seen in CI on
// 2026-12-01, past the tests' stop grace). With the reference held here, the program's own
// objects (servers, channels, state) close as they always did, in order; Exit() then gives
// gRPC's teardown `bound`, and ends the process without it if it is still waiting.
class GrpcLifetime {
 public:
  GrpcLifetime();
  // Tests: `teardown` runs in place of grpc_shutdown_blocking().
  explicit GrpcLifetime(std::function<void()> teardown);
  ~GrpcLifetime();  // without Exit(): releases the reference, waiting as long as gRPC takes
  GrpcLifetime(const GrpcLifetime&) = delete;
  GrpcLifetime& operator=(const GrpcLifetime&) = delete;

  // Releases the reference and waits at most `bound` for gRPC's teardown: returns `code` when it
  // finishes in time; otherwise logs so, flushes stdout and stderr and ends the process with
  // `code` at once (std::_Exit: no static destructors, which gRPC's threads may still use).
  int Exit(int code, absl::Duration bound = absl::Seconds(2));

 private:
  std::function<void()> teardown_;
  bool released_ = false;
};

}  // namespace shoal::rpc
