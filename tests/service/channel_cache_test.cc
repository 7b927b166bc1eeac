// rpc::ChannelCache's connections (real gRPC on 127.0.0.1:0): caches with shared connections
// reach a server over one TCP connection; caches with their own (rpc::Connection::kOwn), as a
// benchmark's in-process peers have, over one each.

#include "libs/rpc/channel_cache.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/server.h"
#include "shoal/coordinator/v1/registry.grpc.pb.h"

namespace shoal::rpc {
namespace {

using coordinator::v1::RegisterAggregatorRequest;
using coordinator::v1::RegisterAggregatorResponse;
using coordinator::v1::RegistryService;

// Records the client address (IP and port: the TCP connection) of every call.
class CallerPorts final : public RegistryService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterAggregator(grpc::CallbackServerContext* context,
                                               const RegisterAggregatorRequest*,
                                               RegisterAggregatorResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      peers_.push_back(context->peer());
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::vector<std::string> TakePeers() {
    absl::MutexLock lock(&mu_);
    return std::move(peers_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);
};

class ChannelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Server>> server =
        Server::Start({.listen = "127.0.0.1:0", .service_name = "test"}, {&service_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // One call through each cache, twice over; the client addresses the server saw, distinct.
  std::set<std::string> ConnectionsOf(std::deque<ChannelCache>& caches) {
    for (int pass = 0; pass < 2; ++pass) {
      for (ChannelCache& cache : caches) {
        grpc::ClientContext context;
        SetTimeout(context, absl::Seconds(10));
        RegisterAggregatorResponse response;
        const grpc::Status s = RegistryService::NewStub(cache.Get(server_->address()))
                                   ->RegisterAggregator(&context, {}, &response);
        EXPECT_TRUE(s.ok()) << s.error_message();
      }
    }
    const std::vector<std::string> peers = service_.TakePeers();
    EXPECT_EQ(peers.size(), 2 * caches.size());
    return {peers.begin(), peers.end()};
  }

  CallerPorts service_;
  std::unique_ptr<Server> server_;
};

TEST_F(ChannelCacheTest, CachesThatShareConnectionsReachAServerOverOne) {
  std::deque<ChannelCache> caches(3);
  EXPECT_EQ(ConnectionsOf(caches).size(), 1u);
}

TEST_F(ChannelCacheTest, CachesWithConnectionsOfTheirOwnReachAServerOverOneEach) {
  std::deque<ChannelCache> caches;
  for (int i = 0; i < 3; ++i) caches.emplace_back(nullptr, Connection::kOwn);
  // Each keeps its connection from one call to the next.
  EXPECT_EQ(ConnectionsOf(caches).size(), 3u);
}

}  // namespace
}  // namespace shoal::rpc
