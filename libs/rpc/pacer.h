#pragma once

// Spreads what a process sends over its uplink at the uplink's rate, instead of handing TCP the
// bytes as fast as it takes them. A home or edge uplink sits behind a router's queue: bytes
// sent faster than the link fill it, and the acknowledgements of what the process downloads at
// the same time wait in it behind them (their round trip grows by the queue's length), which
// slows those downloads and, with every peer serving others while it fetches from them, the
// whole exchange. Sent at the link's rate the queue stays short (docs/performance.md, "Over
// shaped links").

#include <cstddef>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"

namespace shoal::rpc {

// Uplinks slower than this (bytes/s: 200 Mbit/s) are taken for users' links, which bound what
// goes over them, rather than a datacenter's, where the CPU does.
inline constexpr double kSlowUplinkBelow = 25e6;

// What --serve-pacing asks for: "auto", the uplink as measured, where it is slower than
// kSlowUplinkBelow (faster, or not measured: not paced); "off"; or a rate in Mbit/s.
struct PacingSetting {
  bool automatic = true;
  double bytes_per_second = 0;  // when not automatic; 0: off

  // Errors: INVALID_ARGUMENT naming the flag and the value.
  static absl::StatusOr<PacingSetting> Parse(absl::string_view value);
  // The rate to pace at (bytes/s; 0: not paced) given the measured upload (bytes/s; 0: none).
  double RateFor(double measured_upload) const;
};

// A schedule of the sends of every stream that shares one uplink: each message takes its
// bytes' time at the rate, after the messages reserved before it. Idle time is not saved up:
// after a pause the next message goes at once, and the one after it waits for it. Thread-safe.
class Pacer {
 public:
  // `rate`: bytes per second, asked at each reservation (it may change, e.g. once the uplink is
  // measured); 0 or less: not paced. `clock` must outlive the Pacer.
  Pacer(std::function<double()> rate, Clock& clock = RealClock::Get());

  // How long to wait before sending a message of `bytes` (zero when not paced or when the link
  // is free), reserving its time.
  absl::Duration Reserve(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The rate now (bytes/s; 0: not paced).
  double rate() const;
  // The message size for a paced stream: 5 ms of the rate within [16 KiB, 256 KiB], so that
  // each burst the link's queue takes is short; `unpaced` when not paced.
  size_t MessageBytes(size_t unpaced) const;

 private:
  const std::function<double()> rate_;
  Clock& clock_;
  absl::Mutex mu_;
  absl::Time free_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the link's, as scheduled
};

}  // namespace shoal::rpc
