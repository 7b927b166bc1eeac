#include "services/aggregator/replicas.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/rpc/retry.h"
#include "libs/tensor/compression.h"

namespace shoal::aggregator {

void CopyToBackups(const AggregatorCore::Push::Replica& replica, AggregatorClient& client,
                   AggregatorMetrics& metrics) {
  if (replica.backups.empty()) return;
  std::shared_ptr<const tensor::EncodedModel> update = tensor::EncodeRaw(replica.update);
  for (const std::string& backup : replica.backups) {
    absl::StatusOr<bool> copied = client.PushUpdate(
        backup, replica.meta, update,
        absl::Now() + rpc::TransferTimeout(kCopyTimeout, update->payload_bytes()));
    if (copied.ok()) {
      metrics.replications_copied.Increment();
      metrics.bytes_sent.Increment(static_cast<double>(update->payload_bytes()));
      continue;
    }
    metrics.replications_failed.Increment();
    LogWarning("round ", replica.meta.round(), " of task '", EscapeBytes(replica.meta.task()),
               "': the copy of peer '", EscapeBytes(replica.meta.peer_id()),
               "''s update to backup ", backup,
               " failed (the backup is behind from here on): ", copied.status().message());
  }
}

}  // namespace shoal::aggregator
