#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/aggregator/sessions/session.h"
#include "services/aggregator/update_buffer.h"

namespace shoal::aggregator {

// A federated-async buffer (OpenBuffer): up to async.buffer_size updates wait, and the push (or
// child aggregate) that fills the buffer aggregates them into the next version; a tree's node
// below the root forwards that aggregate to its parent instead (SessionHost::Forward) and takes
// its versions from there. The buffer's rules are in UpdateBuffer; this session locks,
// publishes and sends the events. A task in a buffer has no rounds. A restore or other
// settings replace the session (the old one's updates are dropped, as an abandoned round's).
class BufferSession final : public AggregationSession {
 public:
  // Checks the settings (INVALID_ARGUMENT naming the field) and makes the strategy.
  static absl::StatusOr<std::shared_ptr<BufferSession>> Make(const OpenBufferParams& params,
                                                             SessionHost& host);

  absl::StatusOr<std::shared_ptr<AggregationSession>> Open(
      TaskState& task, const std::shared_ptr<AggregationSession>& current) override;
  absl::Status CheckReplaceable(const TaskState& task) const override;
  void Abandon() override;
  std::shared_ptr<AggregationSession> OnNewVersion(TaskState& task) override;
  absl::Status Target(TaskState& task, const PushMeta& meta, PushTarget& target) override;
  void StartPushing(const std::string& peer) override { buffer_->pushing().insert(peer); }
  void StopPushing(const std::string& peer) override { buffer_->pushing().erase(peer); }
  Acceptance Accept(TaskState& task, PushedUpdate& update) override;
  void Fold(const std::shared_ptr<TaskState>& task, PushedUpdate& update) override;
  absl::StatusOr<RoundResult> Close(TaskState& task, uint64_t round) override;
  absl::StatusOr<std::shared_ptr<const PartialResult>> ClosePartial(TaskState& task,
                                                                    uint64_t round) override;
  absl::StatusOr<bool> AddPartial(const std::shared_ptr<TaskState>& task, const PartialMeta& meta,
                                  const aggregation::PartialSum& partial) override;
  absl::StatusOr<size_t> PartialValues(const TaskState& task, uint64_t round) const override;
  v1::ParentRound ParentOf(uint64_t) const override { return {}; }
  void Describe(v1::WatchStarted& started) const override;

 private:
  BufferSession(SessionHost& host, std::unique_ptr<UpdateBuffer> buffer)
      : host_(host), buffer_(std::move(buffer)) {}
  // Without mu(): aggregates the buffer while it is full (the caller claimed its passes).
  void RunPasses(const std::shared_ptr<TaskState>& task);
  // Under mu(): whether this is still the task's session (not reset, replaced or released).
  bool Current(const TaskState& task) const { return !task.released && task.session.get() == this; }

  SessionHost& host_;
  const std::unique_ptr<UpdateBuffer> buffer_;  // guarded by host_.mu()
  bool abandoned_ = false;                      // its updates left the metrics
};

}  // namespace shoal::aggregator
