#include "libs/rpc/channel_cache.h"

#include "libs/rpc/channel.h"

namespace shoal::rpc {

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = MakeChannel(
        address, credentials_ != nullptr ? credentials_ : grpc::InsecureChannelCredentials(),
        connection_);
  }
  return channel;
}

void ChannelCache::Forget(const std::string& address) {
  std::shared_ptr<grpc::Channel> old;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it == channels_.end()) return;
  old = std::move(it->second);
  channels_.erase(it);
}

}  // namespace shoal::rpc
