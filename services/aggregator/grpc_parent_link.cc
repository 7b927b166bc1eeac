#include "services/aggregator/grpc_parent_link.h"

#include "services/aggregator/partial_wire.h"

namespace shoal::aggregator {

absl::Status GrpcParentLink::Send(const v1::ParentRound& parent, const PartialResult& partial,
                                  absl::Time deadline) {
  const absl::string_view bytes = PartialBytes(partial.sum);
  absl::StatusOr<bool> sent = parents_.PushPartial(
      parent.address(), PartialMetaFor(partial, parent.child()), bytes, deadline);
  if (sent.ok()) metrics_.bytes_sent.Increment(static_cast<double>(bytes.size()));
  return sent.status();
}

}  // namespace shoal::aggregator
