#include "libs/rpc/address_list.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/common/address.h"
#include "libs/common/log.h"
#include "libs/rpc/channel.h"

namespace shoal::rpc {
namespace {

std::vector<std::shared_ptr<grpc::Channel>> Channels(
    const std::vector<std::string>& addresses,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : addresses) {
    // Several addresses: a refused call moves on at once rather than after the channel's own
    // retries (about 1.5 s each time).
    if (addresses.size() > 1) {
      channels.push_back(MakeProbeChannel(address, credentials));
    } else {
      channels.push_back(credentials != nullptr ? MakeChannel(address, credentials)
                                                : MakeChannel(address));
    }
  }
  return channels;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> AddressList::Parse(absl::string_view list,
                                                            absl::string_view flag) {
  if (list.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": required (HOST:PORT[,HOST:PORT...])"));
  }
  std::vector<std::string> addresses;
  for (absl::string_view address : absl::StrSplit(list, ',')) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(address, flag);
    if (!parsed.ok()) return parsed.status();
    if (std::find(addresses.begin(), addresses.end(), address) != addresses.end()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", address, " is given twice"));
    }
    addresses.emplace_back(address);
  }
  return addresses;
}

absl::StatusOr<std::unique_ptr<AddressList>> AddressList::Create(
    absl::string_view list, absl::string_view flag,
    std::shared_ptr<grpc::ChannelCredentials> credentials, std::string service) {
  absl::StatusOr<std::vector<std::string>> addresses = Parse(list, flag);
  if (!addresses.ok()) return addresses.status();
  return std::unique_ptr<AddressList>(
      new AddressList(*std::move(addresses), std::move(credentials), std::move(service)));
}

AddressList::AddressList(std::vector<std::string> addresses,
                         std::shared_ptr<grpc::ChannelCredentials> credentials, std::string service)
    : addresses_(std::move(addresses)),
      channels_(Channels(addresses_, credentials)),
      service_(std::move(service)) {}

AddressList::Target AddressList::Current() const {
  absl::MutexLock lock(&mu_);
  return Target{addresses_[current_], channels_[current_]};
}

void AddressList::MoveOn(const std::string& failed, absl::string_view why) {
  if (addresses_.size() < 2) return;
  absl::MutexLock lock(&mu_);
  if (addresses_[current_] != failed) return;  // another caller moved on already
  current_ = (current_ + 1) % addresses_.size();
  const absl::Time now = absl::Now();
  if (now - log_window_ >= absl::Seconds(10)) {
    log_window_ = now;
    logged_ = 0;
  }
  if (logged_++ < addresses_.size()) {
    LogWarning(service_, " ", failed, ": ", why, "; trying ", addresses_[current_]);
  }
}

std::string AddressList::ToString() const { return absl::StrJoin(addresses_, ","); }

}  // namespace shoal::rpc
