#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "libs/capacity/local_capacity.h"
#include "shoal/common/v1/capacity.pb.h"

namespace shoal::capacity {

// The round-trip time from here to each of `addresses` (aggregators): for each, on its own
// thread and channel (`credentials`; null = plaintext), one gRPC health check that opens the
// connection, then `probes` more, keeping the smallest. All run at once, each address's checks
// within `timeout`; an address that does not answer is left out. At most kMaxAggregatorRtts
// addresses (the rest are ignored). Blocks until every thread is done.
std::vector<common::v1::AggregatorRtt> MeasureAggregatorRtts(
    const std::vector<std::string>& addresses,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials, absl::Duration timeout,
    int probes = 3);

}  // namespace shoal::capacity
