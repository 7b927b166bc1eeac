#include "libs/rpc/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace shoal::rpc {
namespace {

// Transport-level retries of UNAVAILABLE apply to all methods: gRPC only retries a call when no
// response has been seen, and every mutating Shoal RPC is idempotent by design.
constexpr char kServiceConfig[] = R"json({
  "methodConfig": [{
    "name": [{}],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.1s",
      "maxBackoff": "2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})json";

grpc::ChannelArguments Arguments(bool retries, Connection connection = Connection::kShared) {
  grpc::ChannelArguments args;
  if (connection == Connection::kOwn) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Short on purpose: after an outage a peer must be back within seconds (session_client.h).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, retries ? 1 : 0);
  if (retries) args.SetServiceConfigJSON(kServiceConfig);
  return args;
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return MakeChannel(address, grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           Connection connection) {
  return grpc::CreateCustomChannel(address, std::move(credentials),
                                   Arguments(/*retries=*/true, connection));
}

std::shared_ptr<grpc::Channel> MakeProbeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(address, std::move(credentials), Arguments(/*retries=*/false));
}

}  // namespace shoal::rpc
