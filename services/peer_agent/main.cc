// shoal-peer: a peer agent (peer_main.h), with no hooks.

#include "services/peer_agent/peer_main.h"

int main(int argc, char** argv) { return shoal::peer::PeerMain(argc, argv, {}); }
