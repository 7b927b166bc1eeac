#include "libs/rpc/channel_cache.h"

#include "libs/rpc/channel.h"

namespace shoal::rpc {

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = credentials_ != nullptr ? MakeChannel(address, credentials_) : MakeChannel(address);
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
