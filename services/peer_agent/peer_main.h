#pragma once

// The shoal-peer process, shared by shoal-peer (main.cc) and its test build
// (tests/peer_testing/): flags -> PeerOptions -> PeerServer (or, with --dpwa-config,
// StaticGossipOptions -> StaticGossipPeer) -> run until SIGTERM.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "services/peer_agent/peer_hooks.h"

namespace shoal::peer {

struct PeerMainOptions {
  std::string program = "shoal-peer";  // --help's name, and the prefix of log and error lines
  // Appended to each usage line of --help, for the flags the binary adds, e.g. " [--flag X]".
  std::string usage_extra;
  // Called once the flags are parsed: the hooks of the process; null: none (shoal-peer). An
  // error exits with code 2 (it should name the flag at fault).
  std::function<absl::StatusOr<PeerHooks>()> hooks;
};

// Parses the command line (every flag linked into the binary), runs the peer until a shutdown
// signal and returns the exit code: 0, 1 after a fatal error; 2 (exits) on a bad flag.
int PeerMain(int argc, char** argv, const PeerMainOptions& options);

}  // namespace shoal::peer
