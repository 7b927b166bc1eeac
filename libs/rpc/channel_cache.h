#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "libs/rpc/channel.h"

namespace shoal::rpc {

// One channel per remote address, made on first use with Shoal's transport settings
// (MakeChannel) and reused for every later call: the one place clients get their channels from.
// `credentials` null = plaintext; `connection`: whether its channels share their connections with
// the process's other channels (rpc::Connection). Thread-safe.
class ChannelCache {
 public:
  explicit ChannelCache(std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                        Connection connection = Connection::kShared)
      : credentials_(std::move(credentials)), connection_(connection) {}

  std::shared_ptr<grpc::Channel> Get(const std::string& address);
  // Drops the channel of `address` (calls in flight keep it until they finish).
  void Forget(const std::string& address);

 private:
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const Connection connection_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::rpc
