#pragma once

#include <string>

#include "absl/status/status.h"
#include "shoal/common/v1/task.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// What the coordinator refuses in a peer's Hello before it takes the peer in: a name that is not
// the peer's certificate's (`identity`, empty without mutual TLS), a shard outside its count, a
// name over 128 characters, more aggregator round trips than a peer measures or one without a
// usable address. INVALID_ARGUMENT (PERMISSION_DENIED for the name) naming the field.
absl::Status CheckHello(const v1::Hello& hello, const std::string& identity);
// Whether a peer that presented the join token `token` may join `spec`'s task.
bool TokenAdmits(const common::v1::TaskSpec& spec, const std::string& token);

}  // namespace shoal::coordinator
