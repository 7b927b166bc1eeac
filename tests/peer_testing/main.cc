// shoal-peer-testing: shoal-peer plus the fault injection of cluster tests, through the peer's
// hooks (services/peer_agent/peer_hooks.h): --test-byzantine MODE, --test-slow-batch MS and
// --test-stall-masked-round N.
// A test tool, never shipped: shoal-peer has neither flag.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "services/peer_agent/peer_main.h"
#include "tests/peer_testing/byzantine.h"
#include "tests/peer_testing/slow_batch.h"

ABSL_FLAG(std::string, test_byzantine, "",
          "fault injection: corrupt what this peer contributes, MODE scale:FACTOR (its delta "
          "times FACTOR, e.g. scale:-10) or sign-flip (its delta negated): the pushed delta "
          "(federated-sync, federated-async) or the round update every participant aggregates "
          "(decentralized)");
ABSL_FLAG(int64_t, test_slow_batch, 0,
          "slow peer: sleep MS milliseconds after each training batch, in every mode (0 = off)");
ABSL_FLAG(uint64_t, test_stall_masked_round, 0,
          "decentralized with secure aggregation: in round N, once this peer holds every "
          "participant's masked update, stall (never say so) until superseded, to be killed "
          "after masking (0 = off)");

namespace shoal::testing {
namespace {

absl::StatusOr<peer::PeerHooks> TestHooks() {
  SHOAL_ASSIGN_OR_RETURN(ByzantineFault byzantine,
                         ByzantineFault::Parse(absl::GetFlag(FLAGS_test_byzantine)));
  const int64_t slow_ms = absl::GetFlag(FLAGS_test_slow_batch);
  peer::PeerHooks hooks;
  SHOAL_ASSIGN_OR_RETURN(hooks.after_batch, SlowBatchHook(absl::Milliseconds(slow_ms)));
  hooks.update = byzantine.Hooks();
  if (const uint64_t stall = absl::GetFlag(FLAGS_test_stall_masked_round); stall > 0) {
    LogWarning("*** --test-stall-masked-round ", stall,
               ": FAULT INJECTION: this peer stalls in that round after masking; never use it "
               "outside tests ***");
    hooks.update.masked_updates_held = [stall](uint64_t round,
                                               const std::function<bool()>& keep_going) {
      if (round != stall) return;
      LogWarning("round ", round, ": holding every masked update; stalling (test)");
      // A test hook: polls keep_going (superseded, or the process is killed).
      while (keep_going()) absl::SleepFor(absl::Milliseconds(50));
    };
  }
  if (byzantine.active()) {
    LogWarning("*** --test-byzantine ", byzantine.mode(),
               ": FAULT INJECTION: this peer CORRUPTS every update it contributes (factor ",
               byzantine.factor(), "); never use it outside tests ***");
  }
  if (slow_ms > 0) {
    LogWarning("*** --test-slow-batch ", slow_ms,
               ": SLOW PEER: every training batch is followed by a pause of that many "
               "milliseconds; never use it outside tests ***");
  }
  return hooks;
}

}  // namespace
}  // namespace shoal::testing

int main(int argc, char** argv) {
  return shoal::peer::PeerMain(argc, argv,
                               {.program = "shoal-peer-testing",
                                .usage_extra = " [--test-byzantine MODE] [--test-slow-batch MS] "
                                               "[--test-stall-masked-round N]",
                                .hooks = shoal::testing::TestHooks});
}
