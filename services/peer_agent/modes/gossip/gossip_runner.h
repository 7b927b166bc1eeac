#pragma once

// Gossip mode (dpwa's asynchronous pairwise averaging), peer side. See
// docs/explanation/gossip.md and libs/gossip for the math and the peer-choice policy.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/common/clock.h"
#include "libs/rpc/retry.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/mode_runner.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/snapshot_store.h"
#include "shoal/coordinator/v1/session.pb.h"

namespace shoal::peer {

class PeerClient;  // services/peer_agent/peer_client.h

// The runner of one gossip task: waits for GossipMembers{start}, then trains
// rounds x round_batches steps, fetching and interpolating peers' snapshots (dpwa), reports
// GossipProgress every round_batches steps and at the end, evaluates its own model and sends an
// EvalReport. GossipMembers updates are applied at once (Intercept). A loop stopped by a
// disconnect resumes at the next GossipMembers{start}; a finished runner that gets the same
// TaskAssigned again (reconnect, coordinator restart) re-sends its final GossipProgress and
// EvalReport. Owned by the agent (made through the mode registry) or by the static gossip peer;
// the deps must outlive it. Threading: see ModeRunner.
//
// One step: publish the LATEST snapshot (an immutable copy of the current state with clock and
// loss: serving never blocks training) -> with fetch_probability choose a peer (flow control)
// and start one fetch on the fetcher thread (at most one in flight, bounded by timeout_ms) ->
// train one batch -> wait for the fetch -> validate (layout, dtype, finite values: PeerClient;
// finite clock/loss, and L2 distance to this model at most the task's max_update_norm when
// set, here) -> f from the interpolation method -> mix -> clock update -> score.
// Failures (timeout, refused, bad or too distant snapshot) lower the peer's score and demote it
// with backoff; "no snapshot yet" only skips it briefly. No step ever waits for a peer longer than
// timeout_ms.
//
// Mixing order. dpwa mixes the weights after the step with the snapshot the peer published
// before its own step: p = f·peer + (1−f)·(p0 + Δ), so this peer's own update Δ is scaled by
// (1 − f): at f = 0.5 the effective learning rate is halved. By default Shoal mixes the snapshot
// with the weights the fetch started from and keeps the step whole:
// p = f·peer + (1−f)·p0 + Δ = (p0 + Δ) + f·(peer − p0) (the same cost: one pass, p0 is the
// snapshot this peer published anyway). GossipSpec.mix_post_step = true restores dpwa's order.
//
// Optimizer state (SGD momentum, Adam moments) is never exchanged and never reset: it stays
// local, so after a mix the momentum still points along this peer's own recent gradients.
// Buffers (batch-norm statistics) are exchanged and mixed with the parameters when
// GossipSpec.include_buffers is set (Trainer::GetState/SetState).
//
// The registry's factory (mode_registry.cc); the static gossip peer uses it too. Errors:
// INVALID_ARGUMENT when a dependency is missing (deps.send may be null) or the task is not
// gossip.
absl::StatusOr<std::unique_ptr<ModeRunner>> CreateGossipRunner(ModeRunnerDeps deps);

}  // namespace shoal::peer
