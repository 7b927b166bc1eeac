#include "services/aggregator/parent_forwarder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "libs/common/log.h"
#include "libs/rpc/retry.h"
#include "services/aggregator/partial_wire.h"
#include "services/aggregator/sessions/session.h"

namespace shoal::aggregator {
namespace {

// How long one try to send an aggregate to a parent may take: this, plus its bytes at 1 Mbit/s
// (rpc::TransferTimeout).
constexpr absl::Duration kTransferTimeout = absl::Minutes(1);
// Tries per aggregate while the parent answers as temporarily away.
constexpr int kAttempts = 3;

bool Temporary(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsAborted(s);
}

}  // namespace

// One transfer thread: a tree node has one parent, and its aggregates go there in order. The
// queue holds a few aggregates (each one model); more wait in the folds that made them.
ParentForwarder::ParentForwarder(AggregatorMetrics& metrics,
                                 std::function<void(std::vector<float>)> recycle)
    : metrics_(metrics),
      recycle_(std::move(recycle)),
      transfers_(std::make_unique<ThreadPool>(1, 1024)) {}

ParentForwarder::~ParentForwarder() { transfers_.reset(); }

void ParentForwarder::Forward(const v1::ParentRound& parent, PartialResult aggregate) {
  {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  auto shared = std::make_shared<PartialResult>(std::move(aggregate));
  auto send = [this, parent, shared] {
    Send(parent, *shared);
    recycle_(std::move(shared->sum.sum));
    Done();
  };
  if (!transfers_->TrySubmit(send)) {
    metrics_.partials_lost.Increment();
    LogWarning("the buffer of ", TaskLabel(shared->meta.task),
               ": no room to queue the aggregate for the parent ", parent.address());
    Done();
  }
}

void ParentForwarder::Send(const v1::ParentRound& parent, const PartialResult& aggregate) {
  absl::Status sent = absl::FailedPreconditionError("no parent link is set");
  const absl::Duration timeout =
      rpc::TransferTimeout(kTransferTimeout, PartialBytes(aggregate.sum).size());
  for (int attempt = 1; link_ != nullptr; ++attempt) {
    sent = link_->Send(parent, aggregate, absl::Now() + timeout);
    if (sent.ok() || attempt == kAttempts || !Temporary(sent)) break;
    absl::SleepFor(absl::Seconds(attempt));
  }
  if (sent.ok()) {
    metrics_.partials_forwarded.Increment();
    return;
  }
  metrics_.partials_lost.Increment();
  LogWarning("the buffer of ", TaskLabel(aggregate.meta.task), ": the aggregate of ",
             aggregate.meta.contributors.size(), " peers' updates on version ",
             aggregate.meta.base_version, " did not reach the parent ", parent.address(), ": ",
             sent.message());
}

void ParentForwarder::Done() {
  absl::MutexLock lock(&mu_);
  --pending_;
}

void ParentForwarder::AwaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
}

}  // namespace shoal::aggregator
