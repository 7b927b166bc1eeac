#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace shoal::rpc {

// The one place that maps between absl::Status and grpc::Status; the codes share numbering.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace shoal::rpc
