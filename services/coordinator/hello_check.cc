#include "services/coordinator/hello_check.h"

#include "absl/strings/str_cat.h"
#include "libs/capacity/local_capacity.h"

namespace shoal::coordinator {

absl::Status CheckHello(const v1::Hello& hello, const std::string& identity) {
  if (!identity.empty() && !hello.name().empty() && hello.name() != identity) {
    return absl::PermissionDeniedError(absl::StrCat(
        "hello: name \"", hello.name(), "\" is not the certificate's (\"", identity, "\")"));
  }
  if (hello.shard_count() == 0 || hello.shard_index() >= hello.shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("hello: shard ", hello.shard_index(), "/",
                                                   hello.shard_count(), " is not valid"));
  }
  if (hello.name().size() > 128) {
    return absl::InvalidArgumentError("hello: name longer than 128 characters");
  }
  if (hello.capacity().aggregator_rtts_size() > static_cast<int>(capacity::kMaxAggregatorRtts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello: ", hello.capacity().aggregator_rtts_size(),
                     " aggregator round trips, at most ", capacity::kMaxAggregatorRtts));
  }
  for (const common::v1::AggregatorRtt& rtt : hello.capacity().aggregator_rtts()) {
    if (rtt.address().empty() || rtt.address().size() > 256) {
      return absl::InvalidArgumentError(
          "hello: an aggregator round trip without an address, or with one over 256 characters");
    }
  }
  return absl::OkStatus();
}

bool TokenAdmits(const common::v1::TaskSpec& spec, const std::string& token) {
  return spec.join_token().empty() || spec.join_token() == token;
}

}  // namespace shoal::coordinator
