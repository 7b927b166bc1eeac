#include "services/aggregator/sessions/session.h"

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "services/aggregator/sessions/buffer_session.h"
#include "services/aggregator/sessions/round_session.h"
#include "services/aggregator/sessions/secure_session.h"

namespace shoal::aggregator {

absl::StatusOr<std::shared_ptr<AggregationSession>> MakeSession(const OpenRequest& request,
                                                                SessionHost& host) {
  return std::visit(
      [&host](const auto& params) -> absl::StatusOr<std::shared_ptr<AggregationSession>> {
        using Params = std::decay_t<decltype(params)>;
        if constexpr (std::is_same_v<Params, OpenRoundParams>) {
          if (params.secure_aggregation.enabled()) {
            auto made = SecureRoundSession::Make(params, host);
            if (!made.ok()) return made.status();
            return std::shared_ptr<AggregationSession>(*std::move(made));
          }
          auto made = RoundSession::Make(params, host);
          if (!made.ok()) return made.status();
          return std::shared_ptr<AggregationSession>(*std::move(made));
        } else {
          auto made = BufferSession::Make(params, host);
          if (!made.ok()) return made.status();
          return std::shared_ptr<AggregationSession>(*std::move(made));
        }
      },
      request);
}

absl::StatusOr<std::shared_ptr<SecureExchange>> AggregationSession::Secure(const TaskState& task,
                                                                           uint64_t round) {
  return absl::FailedPreconditionError(absl::StrCat(
      RoundLabel(round, task.name), " is not open with secure aggregation (push the update)"));
}

std::string TaskLabel(const std::string& task) {
  return absl::StrCat("task '", EscapeBytes(task), "'");
}

std::string RoundLabel(uint64_t round, const std::string& task) {
  return absl::StrCat("round ", round, " of ", TaskLabel(task));
}

absl::Status CheckBaseIsLatest(const TaskState& task, uint64_t base_version) {
  if (task.versions.count(base_version) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("base version ", base_version, " of ", TaskLabel(task.name),
                     " is not held (latest is ", task.latest, ")"));
  }
  if (base_version != task.latest) {
    return absl::FailedPreconditionError(absl::StrCat("base version ", base_version, " of ",
                                                      TaskLabel(task.name), " is not the latest (",
                                                      task.latest, ")"));
  }
  return absl::OkStatus();
}

void NotifyAccepted(SessionHost& host, uint64_t round, const PushedUpdate& update) {
  v1::TaskEvent event;
  v1::PushAccepted& accepted = *event.mutable_push_accepted();
  accepted.set_round(round);
  accepted.set_peer_id(update.meta.peer_id);
  accepted.set_base_version(update.meta.base_version);
  accepted.set_num_samples(update.meta.num_samples);
  accepted.set_train_ms(update.meta.train_ms);
  accepted.set_update_bytes(update.bytes_received);
  host.Notify(update.meta.task, event);
}

}  // namespace shoal::aggregator
