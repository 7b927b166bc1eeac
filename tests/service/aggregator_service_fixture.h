#pragma once

// What the AggregatorService tests share: an in-process shoal-aggregator server on 127.0.0.1:0
// with a fake coordinator RegistryService as its neighbour, a ~1.3 MB model layout, and helpers
// for the RPCs.

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/server.h"
#include "libs/rpc/status.h"
#include "services/aggregator/aggregator_server.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"

namespace shoal::aggregator {

// Records the addresses aggregators register with and the tasks they list; answers with the
// tasks the test names to free.
class FakeRegistry final : public coordinator::v1::RegistryService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterAggregator(
      grpc::CallbackServerContext* context,
      const coordinator::v1::RegisterAggregatorRequest* request,
      coordinator::v1::RegisterAggregatorResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      addresses_.push_back(request->address());
      tasks_.assign(request->tasks().begin(), request->tasks().end());
      for (const std::string& task : release_) response->add_release(task);
    }
    response->set_heartbeat_interval_ms(200);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Waits until `n` registrations arrived (or the deadline passed); returns them.
  std::vector<std::string> WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](FakeRegistry* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                               return r->addresses_.size() >= r->want_;
                             },
                             this),
                         timeout);
    return addresses_;
  }
  // Waits until a registration lists exactly `tasks`; whether one did before the deadline.
  bool WaitForTasks(const std::vector<std::string>& tasks, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    want_tasks_ = tasks;
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](FakeRegistry* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                                      return r->tasks_ == r->want_tasks_;
                                    },
                                    this),
                                timeout);
  }
  // The tasks every answer from now on names to free.
  void set_release(std::vector<std::string> tasks) {
    absl::MutexLock lock(&mu_);
    release_ = std::move(tasks);
  }
  void set_want(size_t n) {
    absl::MutexLock lock(&mu_);
    want_ = n;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> tasks_ ABSL_GUARDED_BY(mu_);  // the newest registration's
  std::vector<std::string> want_tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> release_ ABSL_GUARDED_BY(mu_);
  size_t want_ ABSL_GUARDED_BY(mu_) = 1;
};

inline tensor::ModelLayout Layout() {
  // ~1.3 MB so that tensors span several 1 MiB chunks.
  return *tensor::ModelLayout::Create({{"conv1.weight", {16, 1, 5, 5}},
                                       {"conv1.bias", {16}},
                                       {"fc.weight", {320, 1000}},
                                       {"fc.bias", {320}}});
}

inline tensor::FlatModel Filled(std::function<float(size_t)> f,
                                tensor::ModelLayout layout = Layout()) {
  tensor::FlatModel m;
  m.layout = std::move(layout);
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = f(i);
  return m;
}

class AggregatorServiceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc::ServerOptions registry_options;
    registry_options.listen = "127.0.0.1:0";
    registry_options.service_name = "fake-coordinator";
    auto registry_server = rpc::Server::Start(registry_options, {&registry_});
    ASSERT_TRUE(registry_server.ok()) << registry_server.status();
    registry_server_ = *std::move(registry_server);

    AggregatorOptions options;
    options.tls.insecure = true;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.coordinator = registry_server_->address();
    options.max_concurrent_pushes = 4;
    options.shutdown_grace = absl::Seconds(1);
    auto server = AggregatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::AggregatorService::NewStub(rpc::MakeChannel(server_->address()));
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
    if (registry_server_) registry_server_->Shutdown(absl::Seconds(1));
  }

  absl::StatusOr<aggregator::v1::PutModelResponse> Put(const std::string& task, uint64_t version,
                                                       const tensor::FlatModel& m) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::PutModelResponse response;
    auto writer = stub_->PutModel(&ctx, &response);
    absl::Status s = rpc::WritePutModel(*writer, tensor::MakeModelMeta(task, version, m), m);
    if (!s.ok()) return s;
    return response;
  }

  absl::StatusOr<tensor::ReceivedModel> Get(const std::string& task,
                                            std::optional<uint64_t> version = std::nullopt) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::GetModelRequest request;
    request.set_task(task);
    if (version) request.set_version(*version);
    auto reader = stub_->GetModel(&ctx, request);
    return rpc::ReadModelStream(*reader, {}, &ctx);
  }

  absl::Status Open(const std::string& task, uint64_t round, uint64_t base,
                    std::vector<std::string> peers, double max_norm = 0) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(10));
    aggregator::v1::OpenRoundRequest request;
    request.set_task(task);
    request.set_round(round);
    request.set_base_version(base);
    for (auto& p : peers) request.add_expected_peers(p);
    request.set_max_update_norm(max_norm);
    aggregator::v1::OpenRoundResponse response;
    return rpc::FromGrpcStatus(stub_->OpenRound(&ctx, request, &response));
  }

  absl::StatusOr<aggregator::v1::CloseRoundResponse> Close(const std::string& task,
                                                           uint64_t round) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::CloseRoundRequest request;
    request.set_task(task);
    request.set_round(round);
    aggregator::v1::CloseRoundResponse response;
    absl::Status s = rpc::FromGrpcStatus(stub_->CloseRound(&ctx, request, &response));
    if (!s.ok()) return s;
    return response;
  }

  aggregator::v1::UpdateMeta Meta(const std::string& peer, uint64_t samples,
                                  const std::string& task = "t", uint64_t round = 1,
                                  uint64_t base = 0) {
    aggregator::v1::UpdateMeta meta;
    meta.set_task(task);
    meta.set_round(round);
    meta.set_peer_id(peer);
    meta.set_base_version(base);
    meta.set_num_samples(samples);
    meta.set_train_loss(0.25);
    return meta;
  }

  absl::StatusOr<bool> Push(const aggregator::v1::UpdateMeta& meta, const tensor::FlatModel& d) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::PushUpdateResponse response;
    auto writer = stub_->PushUpdate(&ctx, &response);
    absl::Status s = rpc::WritePushUpdate(*writer, meta, d);
    if (!s.ok()) return s;
    return response.duplicate();
  }

  // Pushes hand-made frames (for malformed streams).
  absl::Status PushFrames(const aggregator::v1::UpdateMeta& meta,
                          const std::vector<common::v1::TensorFrame>& frames) {
    grpc::ClientContext ctx;
    rpc::SetTimeout(ctx, absl::Seconds(30));
    aggregator::v1::PushUpdateResponse response;
    auto writer = stub_->PushUpdate(&ctx, &response);
    aggregator::v1::PushUpdateRequest request;
    *request.mutable_meta() = meta;
    bool ok = writer->Write(request);
    for (size_t i = 0; ok && i < frames.size(); ++i) {
      *request.mutable_frame() = frames[i];
      ok = writer->Write(request);
    }
    if (ok) writer->WritesDone();
    return rpc::FromGrpcStatus(writer->Finish());
  }

  double Metric(const std::string& name, const std::string& reason = "") {
    for (const auto& family : server_->registry().Collect()) {
      if (family.name != name) continue;
      double total = 0;
      for (const auto& m : family.metric) {
        bool match = reason.empty();
        for (const auto& label : m.label) {
          if (label.name == "reason" && label.value == reason) match = true;
        }
        if (!match) continue;
        total += m.counter.value + m.gauge.value;
      }
      return total;
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }

  FakeRegistry registry_;
  std::unique_ptr<rpc::Server> registry_server_;
  std::unique_ptr<AggregatorServer> server_;
  std::unique_ptr<v1::AggregatorService::Stub> stub_;
};

}  // namespace shoal::aggregator
