#pragma once

#include <grpcpp/support/server_callback.h>

#include <cstddef>
#include <deque>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "libs/rpc/status.h"

namespace shoal::rpc {

// A server bidi stream whose writes may come from any thread: Send() queues a message and the
// writes are issued one at a time; Close() ends the stream with a status once the queue is
// written (or at once when a write failed). Finish() is issued only when no write is in flight
// and none starts after it, so the reactor is never used after OnDone(). A queue longer than
// `max_queued` closes the stream (RESOURCE_EXHAUSTED `overflow_message`) and calls OnOverflow().
// Subclasses read (OnReadDone: StartRead again unless closing()) and handle OnDone.
template <typename Request, typename Response>
class QueuedBidiReactor : public grpc::ServerBidiReactor<Request, Response> {
 public:
  void Send(const Response& message) ABSL_LOCKS_EXCLUDED(mu_) {
    const Response* first = nullptr;
    bool overflow = false;
    {
      absl::MutexLock lock(&mu_);
      if (close_requested_) return;
      if (queue_.size() >= max_queued_) {
        RequestCloseLocked(absl::ResourceExhaustedError(overflow_message_));
        overflow = true;
      } else {
        queue_.push_back(message);
        if (writing_) return;
        writing_ = true;
        first = &queue_.front();
      }
    }
    if (first != nullptr) {
      this->StartWrite(first);
      return;
    }
    if (overflow) OnOverflow();
    MaybeFinish();
  }

  void Close(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      RequestCloseLocked(status);
    }
    MaybeFinish();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    const Response* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {  // the call broke: nothing more goes out
        queue_.clear();
        RequestCloseLocked(absl::UnavailableError("the stream broke"));
      }
      if (!queue_.empty() && !close_requested_) {
        next = &queue_.front();
      } else {
        writing_ = false;
        if (close_requested_ && !finishing_) finish = finishing_ = true;
      }
    }
    if (next != nullptr) this->StartWrite(next);
    if (finish) this->Finish(ToGrpcStatus(final_status_));
  }

 protected:
  explicit QueuedBidiReactor(size_t max_queued = 10000,
                             std::string overflow_message = "too many undelivered messages")
      : max_queued_(max_queued), overflow_message_(std::move(overflow_message)) {}

  // True once Close() was called (or a write failed): no need to read on.
  bool closing() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return close_requested_;
  }
  virtual void OnOverflow() {}

 private:
  void RequestCloseLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (close_requested_) return;
    close_requested_ = true;
    final_status_ = status;
  }

  void MaybeFinish() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!close_requested_ || writing_ || finishing_) return;
      finishing_ = true;
    }
    this->Finish(ToGrpcStatus(final_status_));
  }

  const size_t max_queued_;
  const std::string overflow_message_;
  mutable absl::Mutex mu_;
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_;  // written once under mu_ before finishing_ is set
};

}  // namespace shoal::rpc
