#pragma once

#include <memory>

#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/mode_task.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::coordinator {

// The coordinator side of a gossip task (mode: gossip): membership only, no rounds to drive.
// Members are the assigned peers. While fewer than min_participants: Waiting to each. Then
// GossipMembers{peers, start=true} to everyone, and again to everyone at every membership change
// (late joiners start at once). GossipProgress updates TaskStatus.peers (step, clock, loss); a
// RoundSummary is appended each time the slowest active member passes another round_batches
// steps ("round" r = every member did r x round_batches steps). The task completes when every
// current member sent GossipProgress{done} and its EvalReport. Phase GOSSIPING, then EVALUATING.
// Not thread-safe: driven by CoordinatorCore under its lock.
// The mode registry's factory (services/coordinator/mode_registry.cc); gossip has no options.
std::unique_ptr<ModeTask> MakeGossipTask(const v1::TaskStatus& status, const ModeOptions& options,
                                         CoordinatorMetrics& metrics);

}  // namespace shoal::coordinator
