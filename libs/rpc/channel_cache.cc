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

}  // namespace shoal::rpc
