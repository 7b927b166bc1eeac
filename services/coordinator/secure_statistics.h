#pragma once

// The federation's statistics of a task with secure aggregation (privacy.secure_aggregation):
// the coordinator adds up the peers' moments masked, and learns only their sum. The pairwise
// double masking of libs/privacy/secagg/pairwise_round.h, with the coordinator adding up:
//   1. each peer sends a mask key for the current attempt (SecureMoments.key);
//   2. once `need` present peers have, they are the participants: each is sent every
//      participant's identity and mask keys (SecureStatistics.participants) and answers its
//      moments, encoded in fixed point (libs/privacy/moments_codec.h) and masked;
//   3. once every participant's masked moments are in, each is asked for its self-mask seed
//      (SecureStatistics.unmask); with every seed in, the pairwise masks cancel in the sum and
//      the self masks are removed: the sum of the participants' moments, decoded.
// A participant that leaves before the sum is complete abandons the attempt: it is never
// unmasked (no pairwise seed is ever asked for), and every peer that sent a key is told to
// advertise a fresh one for the next attempt (SecureStatistics.restart). So does a participant
// that has not answered step 2 or 3 within `step_timeout` of the step's start (Expire): it is
// dropped, is not told to restart, and takes no part in a later attempt until it leaves or
// reconnects. Peers that send keys while a masking runs wait for the sum like any later peer.
// Plain C++: CoordinatorCore holds it under its lock, drives Expire from its timers and sends
// what it returns; nothing is stored (after a restart of the coordinator the peers, assigned
// again, start over).

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "libs/data/feature_moments.h"
#include "libs/privacy/moments_codec.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::coordinator {

class SecureStatistics {
 public:
  // What a call produced: events for peers, and once the sum is complete, the participants and
  // their added-up moments.
  struct Effects {
    std::vector<std::pair<std::string, v1::SecureStatistics>> sends;
    std::optional<data::FeatureMoments> total;
    std::vector<std::string> peers;  // the participants, ascending
    // Participants dropped for not answering a step in time (Expire), ascending.
    std::vector<std::string> dropped;
  };

  // `need`: the participants of a masking (min_participants, at least 3); `bound`: the task's
  // feature bound (MomentsCodec); `features`: the task's feature count, 0 when the data tell it;
  // `step_timeout`: how long the participants have to answer step 2 or 3.
  SecureStatistics(std::string task, size_t need, double bound, size_t features,
                   absl::Duration step_timeout);

  // A step of `peer` (its identity key from its Hello) at `now`. Errors: INVALID_ARGUMENT a
  // malformed step, a feature count that differs from the first peer's, an identity key missing;
  // FAILED_PRECONDITION a step of another attempt, one not asked for now, or one of a peer
  // dropped for silence.
  absl::Status Receive(const std::string& peer, const std::string& identity_key,
                       const v1::SecureMoments& step, absl::Time now, Effects& fx);
  // `peer` left the task: a participant of a masking in progress restarts it.
  void Left(const std::string& peer, Effects& fx);
  // `peer` has a new session: dropped before, it may take part again (its new key restarts a
  // masking it takes part in, as any participant's).
  void Reconnected(const std::string& peer) { dropped_.erase(peer); }
  // At `now`, past the deadline of the current step: the participants that have not answered it
  // are dropped (Effects.dropped) and the others mask again.
  void Expire(absl::Time now, Effects& fx);

  uint32_t attempt() const { return attempt_; }

 private:
  struct Key {
    std::string identity;
    v1::StatisticsMaskKey key;
  };
  absl::Status OnKey(const std::string& peer, const std::string& identity,
                     const v1::StatisticsMaskKey& key, absl::Time now, Effects& fx);
  absl::Status OnMasked(const std::string& peer, const std::string& bytes, absl::Time now,
                        Effects& fx);
  absl::Status OnSeed(const std::string& peer, const std::string& seed, Effects& fx);
  // The participants' sum, once every masked input and seed is in.
  absl::Status Finish(Effects& fx);
  // Abandons the current masking: every peer that sent a key advertises a fresh one.
  void Restart(Effects& fx);
  bool IsParticipant(const std::string& peer) const;
  void SendAll(const v1::SecureStatistics& step, Effects& fx) const;

  const std::string task_;
  const size_t need_;
  const double bound_;
  const absl::Duration step_timeout_;
  size_t features_;
  std::optional<privacy::MomentsCodec> codec_;  // once features_ is known
  uint32_t attempt_ = 0;
  std::map<std::string, Key> keys_;        // of the current attempt
  std::vector<std::string> participants_;  // ascending; empty while collecting keys
  std::map<std::string, std::vector<uint32_t>> masked_;
  std::map<std::string, std::string> seeds_;
  absl::Time step_deadline_ = absl::InfiniteFuture();  // of step 2 or 3 while one runs
  std::set<std::string> dropped_;                      // for silence, until they leave or reconnect
};

}  // namespace shoal::coordinator
