#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

namespace shoal::aggregator {

// Why an update was rejected: the bounded label values of
// shoal_aggregator_updates_rejected_total{reason}.
enum class RejectReason {
  kUnknownTask,     // NOT_FOUND
  kRoundNotOpen,    // FAILED_PRECONDITION: closed, unknown or abandoned round
  kUnexpectedPeer,  // FAILED_PRECONDITION
  kStaleBase,       // FAILED_PRECONDITION: base_version is not the round's base
  kMalformed,       // INVALID_ARGUMENT: bad stream, layout, dtype, size, digest, weight
  kNonFinite,       // INVALID_ARGUMENT: NaN or Inf
  kNormBound,       // INVALID_ARGUMENT: L2 norm above the round's bound
  kBusy,        // RESOURCE_EXHAUSTED / ABORTED: no staging buffer, executor full, concurrent push
  kIncomplete,  // the stream ended or was cancelled before the update was complete
  kUnauthenticated,  // UNAUTHENTICATED / PERMISSION_DENIED: wrong session token or certificate
  kStale,            // FAILED_PRECONDITION: a buffer update above async.max_staleness
  kStandby,          // UNAVAILABLE: a peer's own push to a backup not promoted yet
};
inline constexpr int kNumRejectReasons = 12;
const char* RejectReasonLabel(RejectReason reason);

// The aggregator's Prometheus metrics, registered in an injected registry. Owned by the server
// (or a test); referenced by the core and the service. Thread-safe (prometheus-cpp metrics are).
struct AggregatorMetrics {
  explicit AggregatorMetrics(prometheus::Registry& registry);

  prometheus::Counter& RejectedCounter(RejectReason reason) {
    return *rejected[static_cast<int>(reason)];
  }

  prometheus::Counter& updates_accepted;
  prometheus::Family<prometheus::Counter>& rejected_family;
  prometheus::Counter* rejected[kNumRejectReasons];
  prometheus::Counter& bytes_received;
  prometheus::Counter& bytes_sent;
  prometheus::Counter& download_encodes;         // DownloadDeltas encodings made
  prometheus::Counter& download_encode_seconds;  // and their time
  prometheus::Counter& rounds_completed;
  prometheus::Histogram& round_duration;
  prometheus::Gauge& pushes_in_flight;
  prometheus::Gauge& model_version;
  // Tasks held here (models, a round or buffer): one is freed when its coordinator releases it.
  prometheus::Gauge& tasks_held;
  // Federated-async buffers.
  prometheus::Histogram& update_staleness;  // of the updates accepted into a buffer
  prometheus::Counter& versions_published;  // by buffers (rounds count rounds_completed)
  prometheus::Gauge& buffered_updates;      // waiting in buffers, summed over tasks
  // OpenRound/OpenBuffer refused for --max-buffer-bytes.
  prometheus::Counter& max_buffer_refusals;
  // Trees: partial sums (federated-async: aggregates) added here (repeats not counted), and
  // sent to a parent.
  prometheus::Counter& partials_accepted;
  prometheus::Counter& partials_forwarded;
  prometheus::Counter& partials_lost;  // federated-async aggregates the parent did not take
  // Replicas: accepted updates copied to a backup before the peer's answer, by result
  // (copied, failed).
  prometheus::Family<prometheus::Counter>& replications_family;
  prometheus::Counter& replications_copied;
  prometheus::Counter& replications_failed;
  // Replicas with secure aggregation: a backup promoted in a cluster's secure round started the
  // round again from its first step (fresh keys and masks; nothing of the primary's run is used).
  prometheus::Counter& secure_restarts;
  // Relays for peers behind NAT (RelayService): streams open, calls by result (relayed: the
  // peer answered, even with an error; no_stream: the peer keeps no stream here; failed: the
  // stream ended first, too many calls, or a snapshot too large), snapshot bytes passed on.
  prometheus::Gauge& relay_streams;
  prometheus::Family<prometheus::Counter>& relay_calls_family;
  prometheus::Counter& relay_calls_relayed;
  prometheus::Counter& relay_calls_no_stream;
  prometheus::Counter& relay_calls_failed;
  prometheus::Counter& relay_bytes;
};

}  // namespace shoal::aggregator
