#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

struct HostPort {
  std::string host;
  int port = 0;  // 0 = pick a free port
  std::string ToString() const;
};

// Parses "HOST:PORT" (HOST may be a name, IPv4, or [IPv6]). `what` names the flag or field in
// the error, e.g. "--listen".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what);

// A peer's advertised address: HOST:PORT, or HOST:PORT/PEER_ID for a peer that accepts no
// inbound connection and is reached through the relay (an aggregator's PeerService) at
// HOST:PORT (PeerService calls then carry relay_to = PEER_ID).
struct PeerAddress {
  std::string dial;      // HOST:PORT to open a channel to
  std::string relay_to;  // empty: the peer itself
};
inline PeerAddress SplitPeerAddress(const std::string& address) {
  const size_t slash = address.find('/');
  if (slash == std::string::npos) return {address, ""};
  return {address.substr(0, slash), address.substr(slash + 1)};
}

}  // namespace shoal
