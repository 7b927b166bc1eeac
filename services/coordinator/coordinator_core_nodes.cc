// CoordinatorCore: the nodes (peers and aggregators) as operators see them, with their capacity,
// and the dial-backs that find whether each one can be reached.

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "services/coordinator/coordinator_core.h"

namespace shoal::coordinator {
namespace {

// A relayed peer whose dial-back failed is dialed again after this, then twice as long each
// time up to redial_interval: a relay stream that came up late is seen within seconds, a relay
// that stays unreachable costs a few probes.
constexpr absl::Duration kRelayRedialFirst = absl::Seconds(5);

}  // namespace

void CoordinatorCore::DialBack(bool aggregator, const std::string& id, const std::string& address,
                               const PeerSink* session, Outbox& out) {
  if (options_.dialer == nullptr || address.empty()) return;
  SerialQueue* queue = dial_queues_[next_dial_++ % dial_queues_.size()].get();
  out.push_back([this, queue, aggregator, id, address, session] {
    queue->Post([this, aggregator, id, address, session] {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;  // the core is going: dials still queued are dropped
      }
      // A network deadline: real time, whatever clock the core runs on.
      const absl::Status status =
          options_.dialer->Dial(address, absl::Now() + options_.dial_timeout);
      OnDialBack(aggregator, id, address, session, status);
    });
  });
}

void CoordinatorCore::DialPeer(Peer& peer, Outbox& out) {
  peer.dialed_at = clock_.Now();
  peer.dialing = options_.dialer != nullptr && !peer.hello.listen_address().empty();
  DialBack(/*aggregator=*/false, peer.id, peer.hello.listen_address(), peer.sink.get(), out);
}

void CoordinatorCore::RedialPeers(Outbox& out) {
  if (options_.dialer == nullptr || options_.redial_interval <= absl::ZeroDuration()) return;
  const absl::Time now = clock_.Now();
  for (auto& [id, peer] : peers_) {
    // A dial that has not answered is not queued twice: an address that drops packets costs
    // dial_timeout, and the queue stays within one dial per peer.
    const absl::Duration wait =
        peer.redial_in > absl::ZeroDuration() ? peer.redial_in : options_.redial_interval;
    if (!peer.dialing && now - peer.dialed_at >= wait) DialPeer(peer, out);
  }
}

void CoordinatorCore::CloseSessions(const absl::Status& status) {
  std::vector<std::shared_ptr<PeerSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, peer] : peers_) {
      if (peer.sink != nullptr) sinks.push_back(peer.sink);
    }
  }
  // Outside the lock: a stream that ends disconnects its peer, which takes the lock.
  for (const std::shared_ptr<PeerSink>& sink : sinks) sink->Close(status);
}

void CoordinatorCore::ConvictSilentPeers(Outbox& out) {
  // At least this many silent peers, more than half of those that could be, make a mass
  // silence; held off for at most kMaxHoldLimits silence limits.
  constexpr size_t kMassSilence = 8;
  constexpr int kMaxHoldLimits = 10;
  const absl::Time now = clock_.Now();
  const absl::Duration limit = options_.heartbeat_interval * options_.missed_heartbeats;
  std::vector<std::string> silent;
  size_t judged = 0;  // peers whose session is older than the limit
  for (const auto& [id, peer] : peers_) {
    if (now - peer.since <= limit) continue;
    ++judged;
    if (now - peer.last_seen > limit) silent.push_back(id);
  }
  const bool mass = silent.size() >= kMassSilence && silent.size() * 2 > judged;
  if (mass && (!silence_hold_since_ || now - *silence_hold_since_ < limit * kMaxHoldLimits)) {
    if (!silence_hold_since_) {
      silence_hold_since_ = now;
      LogWarning(silent.size(), " of ", judged, " peers sent no heartbeat for ",
                 absl::FormatDuration(limit),
                 ": not declaring them crashed while most are silent (the coordinator is behind, "
                 "or the network is split) for up to ",
                 absl::FormatDuration(limit * kMaxHoldLimits));
    }
    metrics_.peers_silent_held.Set(static_cast<double>(silent.size()));
    return;
  }
  if (silence_hold_since_) {
    LogWarning("mass silence over after ", absl::FormatDuration(now - *silence_hold_since_), ": ",
               silent.size(), " peers still silent are declared crashed");
    silence_hold_since_.reset();
  }
  metrics_.peers_silent_held.Set(0);
  for (const std::string& id : silent) {
    out.push_back(
        [sink = peers_[id].sink] { sink->Close(absl::UnavailableError("missed heartbeats")); });
    metrics_.peers_crashed.Increment();
    RemovePeer(id, "missed heartbeats", out);
  }
}

void CoordinatorCore::OnDialBack(bool aggregator, const std::string& id, const std::string& address,
                                 const PeerSink* session, const absl::Status& status) {
  const common::v1::Reachability reachability =
      status.ok() ? common::v1::REACHABILITY_REACHABLE : common::v1::REACHABILITY_UNREACHABLE;
  metrics_.dial_backs.Add({{"result", status.ok() ? "reachable" : "unreachable"}}).Increment();
  Outbox out;
  bool moved = false;  // to a relay
  common::v1::Reachability before = common::v1::REACHABILITY_UNKNOWN;
  {
    InputLock lock(*this, out);
    if (aggregator) {
      AggregatorPool::Entry* entry = pool_.Find(id);
      if (entry == nullptr) return;
      before = entry->capacity.reachability();
      entry->capacity.set_reachability(reachability);
    } else {
      auto it = peers_.find(id);
      if (it == peers_.end() || it->second.sink.get() != session ||
          it->second.hello.listen_address() != address) {
        return;  // a later session, or the peer moved to a relay meanwhile
      }
      Peer& peer = it->second;
      peer.dialing = false;
      before = peer.hello.capacity().reachability();
      moved = !status.ok() && peer.hello.relay_fallback() && !peer.hello.wants_relay() &&
              MoveToRelay(peer, out);
      if (moved) {
        LogWarning("peer ", id, ": the coordinator cannot reach it at ", address, " (",
                   status.message(), "); other peers now reach it through the relay at ",
                   peer.hello.listen_address());
      } else {
        peer.hello.mutable_capacity()->set_reachability(reachability);
      }
      peer.redial_in =
          status.ok() || moved || !peer.hello.wants_relay()
              ? absl::ZeroDuration()
              : std::min(std::max(kRelayRedialFirst, peer.redial_in * 2), options_.redial_interval);
    }
    // Logged when it changes: a peer is dialed again every redial_interval.
    if (!status.ok() && !moved && before != common::v1::REACHABILITY_UNREACHABLE) {
      LogWarning(aggregator ? "aggregator " : "peer ", id, ": the coordinator cannot reach it (",
                 status.message(), "); it can only dial out");
    } else if (status.ok() && before == common::v1::REACHABILITY_UNREACHABLE) {
      LogInfo(aggregator ? "aggregator " : "peer ", id, ": reachable again at ", address);
    }
  }
  Flush();
}

bool CoordinatorCore::MoveToRelay(Peer& peer, Outbox& out) {
  const std::string relay = PickRelay(peer.id, /*lost=*/"");
  if (relay.empty()) return false;
  peer.hello.set_wants_relay(true);  // counted among the relay's peers, kept on reconnects
  peer.hello.set_listen_address(absl::StrCat(relay, "/", peer.id));
  peer.hello.mutable_capacity()->set_reachability(common::v1::REACHABILITY_UNKNOWN);
  metrics_.peers_relayed.Increment();
  v1::CoordinatorEvent assigned;
  assigned.mutable_relay_assigned()->set_relay_address(relay);
  SendTo(peer.id, std::move(assigned), out);
  // Its task's mode knows it by address (round peer lists, gossip members).
  if (!peer.task.empty()) RejoinMode(tasks_[peer.task], peer, "moved to a relay", out);
  // Reachable once its relay stream is up (the dial probes through the relay).
  DialPeer(peer, out);
  return true;
}

void CoordinatorCore::RejoinMode(Task& task, const Peer& peer, const char* why, Outbox& out) {
  if (task.mode == nullptr || !IsActive(task)) return;
  ModeEffects fx;
  const absl::Time now = clock_.Now();
  task.mode->RemovePeer(peer.id, why, now, task.status, fx);
  task.mode->AddPeer(
      ModePeer{peer.id, peer.hello.listen_address(), peer.hello.identity_public_key()}, now,
      task.status, fx);
  ApplyModeEffects(task, fx, out);
}

std::string CoordinatorCore::PickRelay(const std::string& peer_id, const std::string& lost) const {
  // A peer that reconnects keeps its relay while that is registered (and not lost).
  auto it = peers_.find(peer_id);
  if (it != peers_.end() && it->second.hello.wants_relay()) {
    const std::string previous = SplitPeerAddress(it->second.hello.listen_address()).dial;
    if (previous != lost && pool_.Has(previous)) return previous;
  }
  // Elected supernodes come and go with their hosts: relays are dedicated aggregators.
  std::set<std::string> exclude;
  for (const auto& [address, entry] : pool_.entries()) {
    if (!entry.host_peer.empty()) exclude.insert(address);
  }
  std::map<std::string, size_t> relayed;
  for (const auto& [id, peer] : peers_) {
    if (peer.hello.wants_relay()) ++relayed[SplitPeerAddress(peer.hello.listen_address()).dial];
  }
  std::set<std::string> without_lost = exclude;
  without_lost.insert(lost);
  std::string relay = pool_.Pick(relayed, without_lost);
  // The lost one only when no other is registered: it may be back.
  return relay.empty() ? pool_.Pick(relayed, exclude) : relay;
}

v1::NodeInfo CoordinatorCore::PeerNode(const Peer& peer) const {
  v1::NodeInfo node;
  node.set_id(peer.id);
  node.set_role("peer");
  node.set_address(peer.hello.listen_address());
  node.set_device(peer.hello.device().empty() ? "cpu" : peer.hello.device());
  node.set_task(peer.task);
  *node.mutable_capacity() = peer.hello.capacity();
  node.set_since_unix_ms(absl::ToUnixMillis(peer.since));
  if (elected_.count(peer.id) > 0) {
    node.set_supernode("elected");
  } else if (peer.hello.supernode()) {
    node.set_supernode("offered");
  }
  return node;
}

v1::NodeInfo CoordinatorCore::AggregatorNode(const std::string& address,
                                             const AggregatorPool::Entry& entry) const {
  v1::NodeInfo node;
  node.set_id(address);
  node.set_role("aggregator");
  node.set_address(address);
  *node.mutable_capacity() = entry.capacity;
  node.set_since_unix_ms(absl::ToUnixMillis(entry.first_seen));
  node.set_supernode(entry.host_peer);
  return node;
}

v1::ListNodesResponse CoordinatorCore::ListNodes() const {
  absl::MutexLock lock(&mu_);
  v1::ListNodesResponse response;
  for (const auto& [id, peer] : peers_) *response.add_peers() = PeerNode(peer);
  for (const auto& [address, entry] : pool_.entries()) {
    *response.add_aggregators() = AggregatorNode(address, entry);
  }
  return response;
}

std::vector<std::string> CoordinatorCore::AggregatorsToMeasure(size_t limit) const {
  absl::MutexLock lock(&mu_);
  const std::map<std::string, size_t> load = AggregatorLoad();
  std::vector<std::pair<size_t, std::string>> order;
  for (const auto& [address, entry] : pool_.entries()) {
    auto it = load.find(address);
    order.emplace_back(it == load.end() ? 0 : it->second, address);
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> addresses;
  for (size_t i = 0; i < order.size() && i < limit; ++i) addresses.push_back(order[i].second);
  return addresses;
}

}  // namespace shoal::coordinator
