#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace shoal::rpc {

// The HTTP/2 receive window of every Shoal stream, client and server side: fixed, with gRPC's
// bandwidth-delay probing off. Probing widens a busy connection's window without bound (to tens
// of MB on 127.0.0.1), and what the window admits is buffered in the receiver while it is slower
// than the wire: a peer downloading a 116 MB model peaked at 3.4-4.6x the model with probing,
// 3.0-3.2x without. 8 MiB in flight fills 640 Mbit/s at 100 ms round trip, 5 Gbit/s at 12 ms.
inline constexpr int kStreamWindowBytes = 8 << 20;

// The largest message a Shoal endpoint receives, on channels and servers alike. Tensors travel
// in chunks of about 1 MiB (tensor::kMaxChunkBytes), never whole.
inline constexpr int kMaxMessageBytes = 8 << 20;

// Whether a channel shares its TCP connection with the process's other channels to the same
// address with the same settings (gRPC's global subchannel pool), or opens one of its own. A
// connection's HTTP/2 streams are read and written one at a time (one transport per
// connection), so streams on a shared connection move their bytes one after another. A service
// opens each remote once and shares; a benchmark that plays several peers in one process gives
// each its own, as separate processes have.
enum class Connection { kShared, kOwn };

// Opens a channel to HOST:PORT with Shoal's transport settings: keepalive, message limits, and a
// retry policy for UNAVAILABLE (transport retries with capped exponential backoff), secured by
// `credentials` (from rpc::Credentials). Channels are meant to be created once per remote and
// reused.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           Connection connection = Connection::kShared);
// A plaintext channel, for tests in one process.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// A channel for probes (dial-backs, round-trip measurements): the same settings without the
// retry policy, so an address that refuses connections answers UNAVAILABLE at once instead of
// after the policy's backoff (about 2 s on 127.0.0.1). Null credentials: plaintext.
std::shared_ptr<grpc::Channel> MakeProbeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials);

// Every outgoing call gets a deadline; this sets it on a fresh context.
inline void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

}  // namespace shoal::rpc
