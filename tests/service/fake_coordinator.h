#pragma once

// A coordinator stand-in for peer tests: SessionService + RegistryService on 127.0.0.1:0 that
// records what peers send on their Session streams and lets the test push events.

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libs/rpc/server.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"
#include "shoal/coordinator/v1/session.grpc.pb.h"

namespace shoal::testing {

using coordinator::v1::CoordinatorEvent;
using coordinator::v1::PeerMessage;

// Sync service: each session's handler thread reads; the test writes. Owned by the test;
// thread-safe.
class FakeCoordinator final : public coordinator::v1::SessionService::Service,
                              public coordinator::v1::RegistryService::Service {
 public:
  grpc::Status RegisterAggregator(grpc::ServerContext*,
                                  const coordinator::v1::RegisterAggregatorRequest*,
                                  coordinator::v1::RegisterAggregatorResponse* response) override {
    response->set_heartbeat_interval_ms(1000);
    return grpc::Status::OK;
  }

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<CoordinatorEvent, PeerMessage>* stream) override {
    PeerMessage first;
    if (!stream->Read(&first) || !first.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected Hello");
    }
    // Welcome goes out before the stream is published, so it is always the first event.
    CoordinatorEvent welcome;
    welcome.mutable_welcome()->set_peer_id(first.hello().name().empty() ? "peer-x"
                                                                        : first.hello().name());
    welcome.mutable_welcome()->set_heartbeat_interval_ms(200);
    if (!stream->Write(welcome)) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    {
      absl::MutexLock lock(&mu_);
      hellos_.push_back(first.hello());
      stream_ = stream;
      context_ = context;
      ++sessions_;
    }
    PeerMessage m;
    while (stream->Read(&m)) {
      absl::MutexLock lock(&mu_);
      if (m.has_heartbeat()) {
        ++heartbeats_;
      } else {
        messages_.push_back(m);
      }
    }
    // The stream dies when this handler returns: wait for a Write() in progress (it holds
    // write_mu_) and unpublish the stream before that, so no Write() can touch it afterwards.
    absl::MutexLock write_lock(&write_mu_);
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    context_ = nullptr;
    return grpc::Status::OK;
  }

  // Writes to the current session. Holds write_mu_ for the whole write, which keeps the session's
  // handler (and so its stream) alive until the write is done.
  bool Write(const CoordinatorEvent& event) {
    absl::MutexLock lock(&write_mu_);
    grpc::ServerReaderWriter<CoordinatorEvent, PeerMessage>* stream;
    {
      absl::MutexLock l(&mu_);
      stream = stream_;
    }
    return stream != nullptr && stream->Write(event);
  }

  // Breaks the current session (as a coordinator crash would).
  void DropSession() {
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) context_->TryCancel();
  }

  // The first not yet taken message for which `match` holds.
  std::optional<PeerMessage> Take(PeerMessage::KindCase kind, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& m : messages_) {
        if (m.kind_case() == kind) return true;
      }
      return false;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&found), timeout)) return std::nullopt;
    for (auto it = messages_.begin(); it != messages_.end(); ++it) {
      if (it->kind_case() == kind) {
        PeerMessage m = *it;
        messages_.erase(it);
        return m;
      }
    }
    return std::nullopt;
  }

  std::optional<coordinator::v1::Hello> WaitHello(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(hellos_.size()) >= n && stream_ != nullptr;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), timeout)) return std::nullopt;
    return hellos_[n - 1];
  }

  bool WaitHeartbeats(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  bool WaitSessionClosed(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stream_ == nullptr; };
    return mu_.AwaitWithTimeout(absl::Condition(&closed), timeout);
  }

  int sessions() {
    absl::MutexLock lock(&mu_);
    return sessions_;
  }

 private:
  absl::Mutex write_mu_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::vector<coordinator::v1::Hello> hellos_ ABSL_GUARDED_BY(mu_);
  std::deque<PeerMessage> messages_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ServerReaderWriter<CoordinatorEvent, PeerMessage>* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ServerContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct FakeCoordinatorServer {
  FakeCoordinator service;
  std::unique_ptr<rpc::Server> server;

  explicit FakeCoordinatorServer(const std::string& listen = "127.0.0.1:0") {
    rpc::ServerOptions options;
    options.listen = listen;
    options.service_name = "fake-coordinator";
    auto s = rpc::Server::Start(
        options, {static_cast<coordinator::v1::SessionService::Service*>(&service),
                  static_cast<coordinator::v1::RegistryService::Service*>(&service)});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server = *std::move(s);
  }
  ~FakeCoordinatorServer() {
    if (server) server->Shutdown(absl::Milliseconds(100));
  }
  std::string address() const { return server->address(); }
};

}  // namespace shoal::testing
