#include "libs/discovery/dht_discovery.h"

#include <opendht/dhtrunner.h>

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"

namespace shoal::discovery {
namespace {

// Nodes only talk to nodes of the same network id: Shoal's DHT never mixes with OpenDHT's
// public network (id 0).
constexpr dht::NetId kShoalNetwork = 0x5348'4f41;  // "SHOA"

dht::InfoHash TaskKey(const std::string& task) {
  return dht::InfoHash::get("shoal/gossip/" + task);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DhtDiscovery>> DhtDiscovery::Create(const DhtOptions& options,
                                                                   AnnouncementSigner signer,
                                                                   AnnouncementVerifier verifier) {
  SHOAL_ASSIGN_OR_RETURN(HostPort listen, ParseHostPort(options.listen, "--dht-listen"));
  std::vector<HostPort> bootstrap;
  for (const std::string& b : options.bootstrap) {
    SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(b, "--dht-bootstrap"));
    if (hp.port == 0) return absl::InvalidArgumentError("--dht-bootstrap: port 0 in " + b);
    bootstrap.push_back(std::move(hp));
  }
  std::vector<dht::SockAddr> binds =
      dht::SockAddr::resolve(listen.host, std::to_string(listen.port));
  if (binds.empty()) {
    return absl::InvalidArgumentError("--dht-listen: cannot resolve " + options.listen);
  }
  // One socket, IPv4 when the name has an IPv4 address (what "localhost" should mean here).
  dht::SockAddr bind = binds.front();
  for (const dht::SockAddr& a : binds) {
    if (a.getFamily() == AF_INET) {
      bind = a;
      break;
    }
  }
  std::unique_ptr<DhtDiscovery> d(new DhtDiscovery());
  d->options_ = options;
  d->signer_ = std::make_unique<AnnouncementSigner>(std::move(signer));
  d->verifier_ = std::make_unique<AnnouncementVerifier>(std::move(verifier));
  d->runner_ = std::make_unique<dht::DhtRunner>();
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.dht_config.node_config.network = kShoalNetwork;
  const sa_family_t family = bind.getFamily();
  (family == AF_INET6 ? config.bind6 : config.bind4) = bind;
  try {
    d->runner_->run(config, dht::DhtRunner::Context());
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--dht-listen: cannot bind ", options.listen, " (", e.what(), ")"));
  }
  const dht::SockAddr bound = d->runner_->getBound(family);
  const bool v6 = listen.host.find(':') != std::string::npos;
  d->address_ = absl::StrCat(v6 ? "[" : "", listen.host, v6 ? "]:" : ":", bound.getPort());
  for (const HostPort& hp : bootstrap) d->runner_->bootstrap(hp.host, std::to_string(hp.port));
  return d;
}

DhtDiscovery::~DhtDiscovery() { Stop(); }

absl::Status DhtDiscovery::Start(const Member& self, MembersCallback on_change) {
  peer::v1::PeerAnnouncement announcement;
  announcement.set_task(options_.task);
  announcement.set_peer_id(self.peer_id);
  announcement.set_address(self.address);
  announcement.set_issued_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count());
  SHOAL_ASSIGN_OR_RETURN(std::string value, signer_->Sign(announcement));
  {
    absl::MutexLock lock(&mu_);
    book_ = std::make_unique<MemberBook>(*verifier_, options_.task, self);
    on_change_ = std::move(on_change);
    on_change_(book_->Members());
  }
  const dht::InfoHash key = TaskKey(options_.task);
  runner_->listen(key,
                  [this](const std::vector<std::shared_ptr<dht::Value>>& values, bool expired) {
                    std::vector<std::string> blobs;
                    for (const auto& v : values) {
                      if (v) blobs.emplace_back(v->data.begin(), v->data.end());
                    }
                    OnValues(blobs, expired);
                    return true;
                  });
  // Permanent: the runner stores it again before it expires, until Stop.
  runner_->put(key, dht::Value(dht::Blob(value.begin(), value.end())), dht::DoneCallbackSimple{},
               dht::time_point::max(), /*permanent=*/true);
  LogInfo("dht discovery: node on ", address_, ", announcing ", self.peer_id, " at ", self.address,
          " for task ", options_.task,
          options_.bootstrap.empty() ? std::string(", no bootstrap node")
                                     : ", bootstrap " + absl::StrJoin(options_.bootstrap, ","));
  return absl::OkStatus();
}

void DhtDiscovery::OnValues(const std::vector<std::string>& values, bool expired) {
  absl::MutexLock lock(&mu_);
  if (stopped_ || !book_) return;
  bool changed = false;
  for (const std::string& v : values) {
    if (expired) {
      changed |= book_->Remove(v);
      continue;
    }
    absl::StatusOr<bool> added = book_->Add(v);
    if (!added.ok()) {
      LogWarning("dht discovery: ignoring a value under task ", options_.task, ": ",
                 added.status().message());
    }
    changed |= added.ok() && *added;
  }
  if (!changed) return;
  std::vector<Member> members = book_->Members();
  std::vector<std::string> names;
  for (const Member& m : members) names.push_back(m.peer_id + "@" + m.address);
  LogInfo("dht discovery: ", members.size(), " member(s) of ", options_.task, ": ",
          absl::StrJoin(names, ", "));
  on_change_(members);
}

void DhtDiscovery::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // Joins the DHT's threads: no callback runs after this.
  if (runner_) runner_->join();
}

}  // namespace shoal::discovery
