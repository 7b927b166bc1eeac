#pragma once

#include "services/aggregator/relay_hub.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::aggregator {

// gRPC adapter for RelayService: each Relay stream is one peer behind NAT, attached to the hub
// after its `open` (under mutual TLS the peer id must be the certificate's name). The hub must
// outlive the server.
class RelayServiceImpl final : public peer::v1::RelayService::CallbackService {
 public:
  explicit RelayServiceImpl(RelayHub& hub) : hub_(hub) {}

  grpc::ServerBidiReactor<peer::v1::RelayReply, peer::v1::RelayCall>* Relay(
      grpc::CallbackServerContext* context) override;

 private:
  RelayHub& hub_;
};

// The aggregator's PeerService: every call names the peer it is for (relay_to) and goes down
// that peer's Relay stream; the answer comes back as the peer gave it (a snapshot's chunks
// unparsed, each passed on as it comes, so the caller checks the peer's digests). Errors:
// INVALID_ARGUMENT no relay_to or a request that does not parse; NOT_FOUND the peer keeps no
// relay stream here; UNAVAILABLE its stream ended before it answered; RESOURCE_EXHAUSTED too
// many calls for it, or more of a snapshot not yet taken by the caller than the hub allows;
// else the peer's own answer.
class RelayPeerServiceImpl final : public peer::v1::PeerService::WithRawCallbackMethod_GetSnapshot<
                                       peer::v1::PeerService::CallbackService> {
 public:
  explicit RelayPeerServiceImpl(RelayHub& hub) : hub_(hub) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetSnapshot(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Probe(grpc::CallbackServerContext* context,
                                  const peer::v1::ProbeRequest* request,
                                  peer::v1::ProbeResponse* response) override;

 private:
  RelayHub& hub_;
};

}  // namespace shoal::aggregator
