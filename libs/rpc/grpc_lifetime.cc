#include "libs/rpc/grpc_lifetime.h"

#include <grpc/grpc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "libs/common/log.h"

namespace shoal::rpc {

GrpcLifetime::GrpcLifetime() : GrpcLifetime(grpc_shutdown_blocking) {}

GrpcLifetime::GrpcLifetime(std::function<void()> teardown) : teardown_(std::move(teardown)) {
  grpc_init();
}

GrpcLifetime::~GrpcLifetime() {
  if (!released_) teardown_();
}

int GrpcLifetime::Exit(int code, absl::Duration bound) {
  if (released_) return code;
  released_ = true;
  // Shared with the teardown thread, which outlives this frame when the process ends first.
  auto done = std::make_shared<absl::Notification>();
  std::thread teardown([done, teardown = std::move(teardown_)] {
    teardown();
    done->Notify();
  });
  if (done->WaitForNotificationWithTimeout(bound)) {
    teardown.join();
    return code;
  }
  teardown.detach();
  LogWarning("gRPC's library teardown is still waiting after ", absl::FormatDuration(bound),
             " (its TCP backup poller, gRPC 1.51); exiting without it");
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace shoal::rpc
