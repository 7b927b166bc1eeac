#include "services/peer_agent/session_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/capacity/aggregator_rtt.h"
#include "libs/capacity/upload_probe.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/channel.h"

namespace shoal::peer {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

absl::Status SessionClientOptions::Validate() const {
  SHOAL_RETURN_IF_ERROR(rpc::AddressList::Parse(coordinator, "--coordinator").status());
  if (default_heartbeat <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_heartbeat must be positive");
  }
  if (welcome_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("welcome_timeout must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SessionClient>> SessionClient::Create(SessionClientOptions options,
                                                                     PeerMetrics& metrics,
                                                                     EventFn on_event,
                                                                     DisconnectFn on_disconnect) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  if (!on_event) return absl::InvalidArgumentError("SessionClient needs an event callback");
  if (options.measured_upload == nullptr) {
    options.measured_upload = std::make_shared<std::atomic<double>>(0.0);
  }
  return std::unique_ptr<SessionClient>(new SessionClient(
      std::move(options), metrics, std::move(on_event), std::move(on_disconnect)));
}

SessionClient::SessionClient(SessionClientOptions options, PeerMetrics& metrics, EventFn on_event,
                             DisconnectFn on_disconnect)
    : options_(std::move(options)),
      metrics_(metrics),
      on_event_(std::move(on_event)),
      on_disconnect_(std::move(on_disconnect)),
      coordinators_(*rpc::AddressList::Create(options_.coordinator, "--coordinator",
                                              options_.credentials, "coordinator")),
      heartbeat_interval_(options_.default_heartbeat) {
  metrics_.connected.Set(0);
}

SessionClient::~SessionClient() { Leave("shutdown"); }

void SessionClient::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  reader_ = std::thread([this] { RunLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

bool SessionClient::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

std::string SessionClient::peer_id() const {
  absl::MutexLock lock(&mu_);
  return peer_id_;
}

bool SessionClient::WaitConnected(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&connected_), timeout);
  return connected_;
}

bool SessionClient::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

absl::Status SessionClient::Send(const PeerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (stream_ == nullptr || writes_done_) {
    return absl::UnavailableError("the session with the coordinator is not up");
  }
  if (!stream_->Write(message)) {
    return absl::UnavailableError("the session with the coordinator broke");
  }
  return absl::OkStatus();
}

grpc::Status SessionClient::RunOnce(const rpc::AddressList::Target& target, bool* welcomed) {
  *welcomed = false;
  grpc::ClientContext context;
  PeerMessage hello;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    context_ = &context;
    welcome_deadline_ = absl::Now() + options_.welcome_timeout;
    *hello.mutable_hello() = options_.hello;
    if (!peer_id_.empty()) hello.mutable_hello()->set_name(peer_id_);
    if (wants_relay_) hello.mutable_hello()->set_wants_relay(true);
    if (!lost_relay_.empty()) hello.mutable_hello()->set_lost_relay(lost_relay_);
    if (const double upload = options_.measured_upload->load(); upload > 0) {
      auto* capacity = hello.mutable_hello()->mutable_capacity();
      capacity->set_upload_bytes_per_second(upload);
      capacity->set_upload_probe_bytes(options_.upload_probe_bytes);
    }
    for (const common::v1::AggregatorRtt& rtt : aggregator_rtts_) {
      *hello.mutable_hello()->mutable_capacity()->add_aggregator_rtts() = rtt;
    }
  }
  std::unique_ptr<Stream> stream =
      coordinator::v1::SessionService::NewStub(target.channel)->Session(&context);
  CoordinatorEvent event;
  bool ok = stream->Write(hello) && stream->Read(&event);
  if (ok && event.has_welcome()) {
    *welcomed = true;
    const auto& w = event.welcome();
    {
      absl::MutexLock lock(&mu_);
      peer_id_ = w.peer_id();
      if (w.heartbeat_interval_ms() > 0) {
        heartbeat_interval_ = absl::Milliseconds(w.heartbeat_interval_ms());
      }
      ++heartbeat_generation_;
      connected_ = true;
    }
    {
      absl::MutexLock lock(&write_mu_);
      stream_ = stream.get();
      writes_done_ = false;
    }
    metrics_.connected.Set(1);
    LogInfo("connected to coordinator ", target.address, " as peer ", w.peer_id(),
            " (heartbeat every ", w.heartbeat_interval_ms(), " ms)");
    on_event_(event);
    while (stream->Read(&event)) on_event_(event);
    {
      absl::MutexLock lock(&write_mu_);
      stream_ = nullptr;
    }
    {
      absl::MutexLock lock(&mu_);
      connected_ = false;
    }
    metrics_.connected.Set(0);
  } else if (ok) {
    context.TryCancel();
  }
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  if (ok && !*welcomed) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "the coordinator's first message was not Welcome");
  }
  return status;
}

void SessionClient::ReconnectWithout(const std::string& relay) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  lost_relay_ = relay;
  if (connected_ && context_ != nullptr) context_->TryCancel();
}

void SessionClient::AskForRelay() {
  absl::MutexLock lock(&mu_);
  wants_relay_ = true;
}

bool SessionClient::MeasureUpload(const rpc::AddressList::Target& target) {
  grpc::ClientContext context;
  rpc::SetTimeout(context, options_.upload_probe_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return true;
    context_ = &context;
  }
  absl::StatusOr<double> rate =
      capacity::MeasureUpload(*coordinator::v1::SessionService::NewStub(target.channel), context,
                              options_.upload_probe_bytes);
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  if (stopping_) return true;
  const capacity::UploadProbeOutcome outcome =
      capacity::LogUploadProbe(rate, target.address, options_.upload_probe_bytes);
  if (outcome == capacity::UploadProbeOutcome::kMeasured) {
    options_.measured_upload->store(*rate);
  }
  return outcome != capacity::UploadProbeOutcome::kRetry;
}

void SessionClient::MeasureAggregatorRtts(const rpc::AddressList::Target& target) {
  if (options_.aggregator_rtt_timeout <= absl::ZeroDuration()) return;
  grpc::ClientContext context;
  rpc::SetTimeout(context, options_.aggregator_rtt_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    context_ = &context;
  }
  coordinator::v1::ListAggregatorsResponse response;
  const grpc::Status status = coordinator::v1::SessionService::NewStub(target.channel)
                                  ->ListAggregators(&context, {}, &response);
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    // Unreachable (the Hello that follows fails too), or an older coordinator: the Hello goes
    // without round trips.
    if (stopping_ || !status.ok()) return;
  }
  const std::vector<std::string> addresses(response.addresses().begin(),
                                           response.addresses().end());
  std::vector<common::v1::AggregatorRtt> rtts = capacity::MeasureAggregatorRtts(
      addresses, options_.credentials, options_.aggregator_rtt_timeout);
  absl::MutexLock lock(&mu_);
  aggregator_rtts_ = std::move(rtts);
}

void SessionClient::RunLoop() {
  // A broken session is tried again at once, and so is each other address; the backoff paces
  // whole passes over the coordinators' addresses.
  rpc::PassBackoff backoff(options_.reconnect_backoff, coordinators_->size());
  bool ever_connected = false;
  bool upload_measured = options_.upload_probe_bytes == 0;
  int failures = 0;
  while (true) {
    const rpc::AddressList::Target target = coordinators_->Current();
    if (!upload_measured) upload_measured = MeasureUpload(target);
    MeasureAggregatorRtts(target);
    bool welcomed = false;
    grpc::Status status = RunOnce(target, &welcomed);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (welcomed) {
      if (ever_connected) metrics_.session_reconnects.Increment();
      ever_connected = true;
      backoff.Reset();
      failures = 0;
      LogWarning("session with coordinator ", target.address, " ended (",
                 status.error_message().empty() ? "stream closed" : status.error_message(),
                 "); reconnecting");
      if (on_disconnect_) on_disconnect_();
    } else {
      // Log the first failure and then every tenth, so a coordinator that starts late does not
      // flood the log.
      if (failures++ % 10 == 0) {
        LogWarning("cannot open a session with coordinator ", target.address, ": ",
                   status.error_message(), " (code ", static_cast<int>(status.error_code()),
                   "); retrying");
      }
      // The next attempt goes to the next address (a standby that took over, or the active one
      // this was a standby of).
      coordinators_->MoveOn(target.address, status.error_message());
    }
    if (!SleepUnlessStopping(backoff.Next())) return;
  }
}

void SessionClient::HeartbeatLoop() {
  PeerMessage heartbeat;
  heartbeat.mutable_heartbeat();
  struct Wake {
    SessionClient* self;
    uint64_t generation;
    static bool Ready(Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return w->self->stopping_ || w->self->heartbeat_generation_ != w->generation;
    }
  };
  while (true) {
    {
      // Sleeps one interval, restarting at once when a new session announces its interval.
      absl::MutexLock lock(&mu_);
      Wake wake{this, heartbeat_generation_};
      mu_.AwaitWithTimeout(absl::Condition(&Wake::Ready, &wake), heartbeat_interval_);
      if (stopping_) return;
      if (heartbeat_generation_ != wake.generation) continue;
      if (!connected_ && context_ != nullptr && absl::Now() >= welcome_deadline_) {
        LogWarning("no Welcome from the coordinator within ",
                   absl::FormatDuration(options_.welcome_timeout), " of the Hello; reconnecting");
        welcome_deadline_ = absl::InfiniteFuture();
        context_->TryCancel();
      }
    }
    if (connected()) Send(heartbeat).IgnoreError();  // a broken stream is the reader's business
  }
}

void SessionClient::Leave(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // a second call finds nothing to send and just joins
  }
  bool sent = false;
  {
    absl::MutexLock lock(&write_mu_);
    if (stream_ != nullptr && !writes_done_) {
      PeerMessage leave;
      leave.mutable_leave()->set_reason(reason);
      sent = stream_->Write(leave) && stream_->WritesDone();
      writes_done_ = true;
    }
  }
  // Give the coordinator a moment to close the stream after Leave, then cancel it (at once when
  // there was no session to say Leave on, e.g. while connecting).
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](SessionClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
                               return c->context_ == nullptr;
                             },
                             this),
                         sent ? options_.leave_grace : absl::ZeroDuration());
    if (context_ != nullptr) context_->TryCancel();
  }
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  metrics_.connected.Set(0);
}

}  // namespace shoal::peer
