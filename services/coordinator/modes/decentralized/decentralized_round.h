#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

// What the coordinator knows of one round of a decentralized task while it runs (who was
// offered it, joined, is ready, takes part, reported, finished), and the summary the history
// keeps of it. A plain record: DecentralizedTask moves it through the round's stages.
struct DecentralizedRound {
  struct Ready {
    uint64_t num_samples = 0;
    double train_loss = 0;
    // Secure aggregation: its signed mask key of the round (RoundReady).
    std::string mask_public_key;
    std::string mask_key_signature;
  };
  struct Done {
    uint64_t digest = 0;
    uint64_t num_samples = 0;
  };

  // Back to joining for the same round (too few ready participants, or a secure round that
  // starts over): the participants, their reports and the sharing state are forgotten; who
  // joined and is ready stays.
  void ReopenJoins();
  // The history's record of the round, completed at `now`. `digests_differ`: the participants
  // reported more than one averaged model (the summary keeps the lowest id's digest).
  v1::RoundSummary Summary(absl::Time now, bool& digests_differ) const;

  uint64_t number = 0;
  absl::Time opened;
  std::optional<absl::Time> first_ready;
  bool joins_open = false;
  std::map<std::string, absl::Time> offered;  // RoundOpen sent -> its ready deadline
  std::map<std::string, absl::Time> joined;   // -> ready deadline
  std::map<std::string, Ready> ready;
  std::set<std::string> excluded;      // removed: no RoundOpen again this round
  std::set<std::string> dropped;       // joined, then left / refused / removed
  std::set<std::string> participants;  // of the current PeerList attempt
  uint32_t attempt = 0;
  uint32_t retries = 0;  // since the last removal
  uint32_t total_retries = 0;
  std::map<std::string, std::set<std::string>> reports;  // reporter -> unreachable
  std::map<std::string, Done> done;
  // Secure aggregation, while SHARING: who holds every masked update of the attempt; once
  // all do, the survivors are fixed (Unmask sent) and their reveals collected.
  std::set<std::string> held;
  bool unmasking = false;
  std::map<std::string, v1::SeedReveal> reveals;
  bool revealed = false;  // MaskReveals sent: each survivor can finish on its own
  absl::Time stage_deadline = absl::InfiniteFuture();
  uint32_t joins = 0;
  uint32_t leaves = 0;
  std::vector<std::string> removed;
};

}  // namespace shoal::coordinator
