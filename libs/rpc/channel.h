#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace shoal::rpc {

// Opens a channel to HOST:PORT with Shoal's transport settings: keepalive, message limits, and a
// retry policy for UNAVAILABLE (transport retries with capped exponential backoff), secured by
// `credentials` (from rpc::Credentials). Channels are meant to be created once per remote and
// reused.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials);
// A plaintext channel, for tests in one process.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Every outgoing call gets a deadline; this sets it on a fresh context.
inline void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

}  // namespace shoal::rpc
