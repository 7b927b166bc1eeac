// AggregatorService.SecureAggregate: a peer's stream of a secure-aggregation round, a thin
// adapter over the round's SecureExchange (sessions/secure_exchange.h); each message of a masked
// update sent in chunks (masked_chunks.h) goes to the exchange as it comes, which folds it.

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/rpc/reactor_handle.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "services/aggregator/aggregator_service.h"
#include "services/aggregator/sessions/secure_exchange.h"

namespace shoal::aggregator {
namespace {

using v1::SecureAggregationRequest;
using v1::SecureAggregationResponse;

class SecureAggregateReactor;

// The exchange's side of the stream: queues the messages and writes one at a time; the end is
// written once the queue is empty. gRPC is called with no lock held (it may run reactions inline).
class StreamLink final : public SecureExchange::Link {
 public:
  explicit StreamLink(std::shared_ptr<rpc::ReactorHandle<SecureAggregateReactor>> handle)
      : handle_(std::move(handle)) {}

  void Send(const SecureAggregationResponse& message) override;
  void End(const absl::Status& status) override;
  // The reactor's OnWriteDone.
  void WriteDone(bool ok);
  bool ended() const {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  // Under mu_: what to do next when no write is in flight: write the front, or finish.
  void Next(const SecureAggregationResponse*& write, bool& finish)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(const SecureAggregationResponse* write, bool finish);

  const std::shared_ptr<rpc::ReactorHandle<SecureAggregateReactor>> handle_;
  mutable absl::Mutex mu_;
  std::deque<SecureAggregationResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // End was called
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class SecureAggregateReactor final
    : public grpc::ServerBidiReactor<SecureAggregationRequest, SecureAggregationResponse> {
 public:
  SecureAggregateReactor(AggregatorCore& core, std::string caller_identity)
      : core_(core),
        caller_identity_(std::move(caller_identity)),
        handle_(std::make_shared<rpc::ReactorHandle<SecureAggregateReactor>>(this)),
        link_(std::make_shared<StreamLink>(handle_)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the peer ended its stream (or it broke): it sends nothing more
      if (exchange_ != nullptr) exchange_->Leave(peer_);
      link_->End(absl::OkStatus());
      return;
    }
    if (exchange_ == nullptr) {
      if (absl::Status joined = Join(); !joined.ok()) {
        link_->End(joined);
        return;
      }
    } else if (absl::Status s = Receive(); !s.ok()) {
      return;  // the stream ended with `s`
    }
    if (!link_->ended()) StartRead(&request_);
  }
  void OnWriteDone(bool ok) override { link_->WriteDone(ok); }
  void OnDone() override { handle_->Detach(); }

 private:
  absl::Status Join() {
    if (!request_.has_join()) {
      return absl::InvalidArgumentError("SecureAggregate's first message must be a join");
    }
    const v1::SecureAggregationJoin& join = request_.join();
    if (absl::Status s =
            core_.CheckCaller(join.task(), join.peer_id(), join.session_token(), caller_identity_);
        !s.ok()) {
      return s;
    }
    if (join.peer_id().empty()) {
      return absl::InvalidArgumentError("SecureAggregationJoin.peer_id is empty");
    }
    absl::StatusOr<std::shared_ptr<SecureExchange>> exchange =
        core_.SecureRound(join.task(), join.round());
    if (!exchange.ok()) return exchange.status();
    if (absl::Status s = (*exchange)->Join(join.peer_id(), link_); !s.ok()) return s;
    peer_ = join.peer_id();
    exchange_ = *std::move(exchange);
    return absl::OkStatus();
  }

  // The message read, to the exchange (which takes a masked update's values).
  absl::Status Receive() {
    absl::Status s = exchange_->Receive(peer_, std::move(request_));
    request_.Clear();
    return s;
  }

  AggregatorCore& core_;
  const std::string caller_identity_;  // the caller's certificate name; "" when plaintext
  const std::shared_ptr<rpc::ReactorHandle<SecureAggregateReactor>> handle_;
  const std::shared_ptr<StreamLink> link_;
  SecureAggregationRequest request_;
  std::string peer_;
  std::shared_ptr<SecureExchange> exchange_;
};

void StreamLink::Next(const SecureAggregationResponse*& write, bool& finish) {
  if (writing_ || finished_) return;
  if (!queue_.empty()) {
    writing_ = true;
    write = &queue_.front();  // stays put until its WriteDone pops it
  } else if (ended_) {
    finished_ = true;
    finish = true;
  }
}

void StreamLink::Act(const SecureAggregationResponse* write, bool finish) {
  if (write != nullptr) {
    handle_->Run([write](SecureAggregateReactor& r) { r.StartWrite(write); });
  } else if (finish) {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = status_;
    }
    handle_->Run([&status](SecureAggregateReactor& r) { r.Finish(rpc::ToGrpcStatus(status)); });
  }
}

void StreamLink::Send(const SecureAggregationResponse& message) {
  const SecureAggregationResponse* write = nullptr;
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    queue_.push_back(message);
    Next(write, finish);
  }
  Act(write, finish);
}

void StreamLink::End(const absl::Status& status) {
  const SecureAggregationResponse* write = nullptr;
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    status_ = status;
    Next(write, finish);
  }
  Act(write, finish);
}

void StreamLink::WriteDone(bool ok) {
  const SecureAggregationResponse* write = nullptr;
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {  // the stream broke: nothing more can be written
      queue_.clear();
      if (!ended_) {
        ended_ = true;
        status_ = absl::CancelledError("the stream broke");
      }
    }
    Next(write, finish);
  }
  Act(write, finish);
}

}  // namespace

grpc::ServerBidiReactor<SecureAggregationRequest, SecureAggregationResponse>*
AggregatorServiceImpl::SecureAggregate(grpc::CallbackServerContext* context) {
  return new SecureAggregateReactor(core_, rpc::CallerIdentity(*context));
}

}  // namespace shoal::aggregator
