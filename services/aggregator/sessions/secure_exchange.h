#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/privacy/secagg/server.h"
#include "shoal/aggregator/v1/aggregator.pb.h"

namespace shoal::aggregator {

// The aggregator's side of one SecAgg+ round (libs/privacy/secagg/round.h) over the peers'
// SecureAggregate streams: it drives a SecAggServer, step by step, and writes each step's
// messages to the peers still in it. A SecureRoundSession owns one per round.
//
// Steps: advertising closes when every participant advertised its keys or left (its stream
// ended), or when RunOut is called (CloseRound: the coordinator's deadline); sharing, masking, the
// consistency check and unmasking close when every peer still in the step sent its message or
// left, or step_timeout after they opened (masking: or after the last chunk of a masked update
// still coming in). A peer whose message of a step did not come (or was refused) is out of the
// round, its stream ended with the reason; a survivor out at the consistency check stays in the
// sum. When the dropouts leave fewer than the threshold (or fewer than threshold survivors sign
// the survivor list) the round fails (FAILED_PRECONDITION from the server) and every stream ends
// with that.
//
// Thread-safe. The server's crypto runs under this class's own mutex; links are written to with
// no lock held.
class SecureExchange {
 public:
  // A participant's stream, as the exchange writes to it. Called with no lock held, from any
  // thread; implementations queue and return.
  class Link {
   public:
    virtual ~Link() = default;
    virtual void Send(const v1::SecureAggregationResponse& message) = 0;
    // The participant's part is over: OK after `done`, else why it is out or the round failed.
    // Nothing is sent after it.
    virtual void End(const absl::Status& status) = 0;
  };

  // What the unmasking step recovered.
  struct Outcome {
    // The ring sum of the survivors' inputs: the exchange's own, not a copy (RunOut is idempotent
    // and returns the same). Once the round is over its owner may move the vector out for the
    // next round's server (SecAggServer::Create's sum_buffer).
    std::shared_ptr<std::vector<uint32_t>> sum;
    std::vector<std::string> survivors;  // sorted
    uint64_t num_samples = 0;            // the survivors' samples
    double loss_sum = 0;                 // sum of train_loss x num_samples over the survivors
  };

  // `start`: what every participant is sent first (its config names the participants and must be
  // the server's). `on_masked`: told of each masked update accepted, with no lock held.
  SecureExchange(std::string label, uint64_t round, v1::SecureAggregationStart start,
                 std::unique_ptr<privacy::secagg::SecAggServer> server, absl::Duration step_timeout,
                 std::function<void(const v1::PushAccepted&)> on_masked);

  // `peer` (authenticated by the caller) joins with its stream, and is sent `start`.
  // FAILED_PRECONDITION: not a participant, joined already, advertising is over, or the round
  // failed.
  absl::Status Join(const std::string& peer, std::shared_ptr<Link> link);
  // A step's message from `peer`. An error refuses it and ends the peer's part (the round goes on
  // without it, as without a peer that dropped out). A masked update may come in several
  // messages (masked_chunks.h): the first carries its report (num_samples, train_loss,
  // train_ms); each message's values are folded into the sum as they come, without a copy (the
  // message's values are taken: SecAggServer::AddMaskedChunk). The update counts (and is told
  // to on_masked) once whole; until then each message keeps the masking step open for
  // step_timeout from its arrival, and a peer that leaves or is refused before its update is
  // whole has its chunks taken back out of the sum.
  absl::Status Receive(const std::string& peer, v1::SecureAggregationRequest message);
  // `peer`'s stream ended: it sends nothing more.
  void Leave(const std::string& peer);
  // Ends the round with `error` (the round was abandoned); no-op once it is over.
  void Fail(absl::Status error);
  // Closes advertising, waits out the other steps (closing each when its time runs out) and
  // returns the outcome, or the failure. Idempotent.
  absl::StatusOr<Outcome> RunOut();
  // The peers whose masked updates were accepted, sorted.
  std::vector<std::string> Accepted() const;

 private:
  enum class Step { kAdvertising, kSharing, kMasking, kConsistency, kUnmasking, kDone, kFailed };
  struct Participant {
    std::shared_ptr<Link> link;
    bool left = false;
    uint64_t num_samples = 0;  // of its masked update (0: none yet)
    double train_loss = 0;
    // Its masked update is coming in chunks: the first one's report, counted once it is whole.
    bool chunking = false;
    uint64_t chunking_samples = 0;
    double chunking_loss = 0;
    int64_t train_ms = 0;
  };
  // Link calls, made once the mutex is released (a link may run gRPC reactions inline).
  using Outbox = std::vector<std::function<void()>>;

  absl::Status JoinLocked(const std::string& peer, std::shared_ptr<Link> link)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `peer` (named `who` in errors) may send now: a participant still in, owing a message,
  // in an exchange that has not failed.
  absl::Status Admit(const std::string& peer, const std::string& who) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Handle(const std::string& peer, const v1::SecureAggregationRequest& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A message of `peer`'s masked update (the whole of it or a chunk); `whole`: it completed it.
  absl::Status HandleMasked(const std::string& peer, v1::SecureMaskedUpdate& masked, bool& whole)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queue a message, or the end, for `link`.
  void Post(const std::shared_ptr<Link>& link, v1::SecureAggregationResponse message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostEnd(const std::shared_ptr<Link>& link, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the current step when every peer owed a message sent it or left, or when `force`
  // (its time ran out, or RunOut ends advertising); and the next ones that have nothing to wait
  // for.
  void MaybeCloseStep(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the protocol on `error`: every link is ended with it.
  void FailProtocol(absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `peer` from the round with `status` on its link.
  void Drop(const std::string& peer, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next step: `owed` are the peers that must answer it; the others are out.
  void BeginStep(Step step, std::set<std::string> owed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string label_;
  const uint64_t number_;
  const v1::SecureAggregationStart start_;
  const absl::Duration step_timeout_;
  const std::function<void(const v1::PushAccepted&)> on_masked_;

  mutable absl::Mutex mu_;
  std::unique_ptr<privacy::secagg::SecAggServer> server_ ABSL_GUARDED_BY(mu_);
  Step step_ ABSL_GUARDED_BY(mu_) = Step::kAdvertising;
  absl::Time step_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::set<std::string> owed_ ABSL_GUARDED_BY(mu_);  // peers that owe the current step a message
  std::map<std::string, Participant> participants_ ABSL_GUARDED_BY(mu_);  // joined
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::vector<uint32_t>> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> survivors_ ABSL_GUARDED_BY(mu_);
  Outbox outbox_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::aggregator
