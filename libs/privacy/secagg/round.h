#pragma once

// Secure aggregation, SecAgg+ (Bell et al. 2020; SecAgg, Bonawitz et al. 2017, is its case of the
// complete graph): the aggregator learns the sum of the participants' inputs, vectors over the
// ring Z_(2^bits) (libs/privacy/fixed_point.h encodes float updates into it), and nothing else
// about any single input while it follows the protocol (it may see any message it relays, and
// participants may drop out at any step). Against an aggregator that deviates, the participants'
// checks (signed keys, sealed shares, the signed survivor list, the unmask request's rules below)
// stop the direct attacks.
//
// Each participant u has neighbours N(u) in a graph every party derives from the public
// SecAggConfig (graph.h). One round, driven by the aggregator (server.h); each participant runs
// a client (client.h):
//   1. Advertise keys. u makes two X25519 key pairs, (c_sk, c_pk) to seal shares and (s_sk, s_pk)
//      for pairwise masks, and signs both public keys with the round id under its identity key
//      (identity.h). The aggregator sends each participant the keys of its neighbours that
//      advertised; u checks every signature (a substituted key is refused).
//   2. Share keys. u draws a self-mask seed b_u and Shamir-splits b_u and s_sk_u, t of m, among
//      the m neighbours that advertised keys. Each neighbour's pair of shares is sealed with
//      ChaCha20-Poly1305 under a key agreed from c_sk_u and the neighbour's c_pk (round, sender
//      and recipient as associated data); the aggregator relays them unread.
//   3. Mask. u opens the shares addressed to it and sends y_u = x_u + PRG(b_u) + sum over the
//      neighbours v that sent it shares of ±PRG(s_uv) mod 2^bits, where s_uv is agreed from s_sk_u
//      and s_pk_v (u adds it when its id sorts below v's, subtracts it otherwise), so each pair's
//      masks cancel in the sum.
//   4. Check consistency (SecAgg's ConsistencyCheck). The aggregator sends every survivor (a
//      participant whose masked input is in the sum) the survivor list S, sorted. u checks that S
//      is sorted, names itself, names only participants, among its neighbours only those that
//      sent it shares, and at least t of them; then signs (round id, S) under its identity key
//      (SignedSurvivorsMessage, identity.h), once. The step closes with at least t signatures
//      (the aggregator checks each), else the round fails. A survivor that does not sign stays
//      in the sum but is not asked to unmask.
//   5. Unmask. The aggregator tells each signer which of its neighbours are survivors and which
//      shared but sent no masked input (dropped), with every signature of S it collected. u
//      first checks that at least t of them, from distinct survivors on the S it signed, verify
//      over (round id, S) against their identity keys (a signature of another list does not),
//      and that the survivors and dropped it is told are exactly its neighbours that sent shares
//      on S and off S. Then it reveals its share of b_v for each survivor v and its share of
//      s_sk_v for each dropped v, once. With t shares of each, the aggregator removes PRG(b_v) of
//      every survivor and the pairwise masks between every dropped participant and its surviving
//      neighbours; the rest cancel. The sum is exactly the ring sum of the survivors' inputs.
//
// What the aggregator learns: the sum over the survivors, who dropped out at which step, and the
// public keys. Revealing both b_v and s_sk_v would unmask v's input, so a client refuses a request
// that names a peer both ways, names peers outside its neighbourhood, names fewer survivors than
// the threshold, contradicts the survivor list it signed or lacks t signatures of it, or comes
// out of turn; it answers a single request per round. Each participant signs one survivor list
// per round, so two different lists can both collect t signatures only if 2t <= the survivors
// plus the participants that sign whatever the aggregator asks (colluding with it); otherwise
// every participant that reveals anything does so for the same S, and an aggregator that tells
// participants different lists is refused and the round fails. On a sparse graph (k < n - 1) t
// is sized to a neighbourhood, not to S, so with 2t or more survivors the signatures do not
// force agreement; there, as everywhere, the threshold rule below keeps a peer's honest
// neighbours from revealing both of its secrets.
//
// The threshold rule: t shares reconstruct a secret, fewer reveal nothing. 2 <= t <= the smallest
// neighbourhood (else no secret could be recovered), and 2t > the largest neighbourhood, so that
// no neighbourhood holds two disjoint sets of t participants that would reveal both of a peer's
// secrets. A round survives any dropouts that leave every participant still in it at least t
// neighbours still in it (each step), t survivors signing the survivor list, and t neighbours
// answering the unmask request; below that the aggregator fails the round with
// FAILED_PRECONDITION and never returns a wrong sum. With the
// complete graph of n participants (n - 1 neighbours each) that is up to n - 1 - t dropouts over
// the whole round.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/privacy/secagg/graph.h"
#include "shoal/privacy/v1/secagg.pb.h"

namespace shoal::privacy::secagg {

inline constexpr int kMinParticipants = 3;
inline constexpr int kMaxParticipants = 65536;  // a secret is split among at most n - 1
inline constexpr uint64_t kMaxVectorLength = uint64_t{1} << 28;  // 1 GiB of ring elements

// A validated SecAggConfig and its neighbourhood graph: what the client and the server of one
// round share. Immutable, so thread-safe.
class SecAggRound {
 public:
  // Errors: INVALID_ARGUMENT naming the SecAggConfig field that is wrong and why.
  static absl::StatusOr<SecAggRound> Create(const v1::SecAggConfig& config);

  const v1::SecAggConfig& config() const { return config_; }
  const std::string& round_id() const { return config_.round_id(); }
  const NeighbourhoodGraph& graph() const { return graph_; }
  int threshold() const { return static_cast<int>(config_.threshold()); }
  int bits() const { return static_cast<int>(config_.ring_bits()); }
  size_t vector_length() const { return static_cast<size_t>(config_.vector_length()); }
  // 2^bits - 1: ring elements are the values up to it.
  uint32_t ring_mask() const;

 private:
  SecAggRound(v1::SecAggConfig config, NeighbourhoodGraph graph)
      : config_(std::move(config)), graph_(std::move(graph)) {}

  v1::SecAggConfig config_;
  NeighbourhoodGraph graph_;
};

}  // namespace shoal::privacy::secagg
