#pragma once

// PeerClient over the SnapshotStores of peers in this process, by address: a fetch is served by
// the same SnapshotStore::Serve that PeerService uses and checked like GrpcPeerClient checks a
// stream (the meta, then every frame through a FrameDecoder), with no gRPC and no sockets.
// Each fetch's deadline is recorded with the bytes it expects (fetches()). Thread-safe; the
// stores must outlive their registration.

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libs/tensor/frame_codec.h"
#include "services/peer_agent/peer_client.h"
#include "services/peer_agent/snapshot_store.h"

namespace shoal::fakes {

class InMemoryPeers final : public peer::PeerClient {
 public:
  struct RecordedFetch {
    absl::Time deadline;
    size_t expected_bytes = 0;  // the expected layout's floats, 4 bytes each
  };

  void Register(const std::string& address, peer::SnapshotStore* store) {
    absl::MutexLock lock(&mu_);
    stores_[address] = store;
  }
  void Unregister(const std::string& address) {
    absl::MutexLock lock(&mu_);
    stores_.erase(address);
  }

  absl::StatusOr<tensor::ReceivedModel> Fetch(const std::string& address,
                                              const peer::v1::GetSnapshotRequest& request,
                                              absl::Time deadline,
                                              const tensor::ModelLayout& expected,
                                              peer::CallCanceller* canceller,
                                              std::vector<float> buffer) override {
    {
      absl::MutexLock lock(&mu_);
      fetches_.push_back({deadline, expected.total_bytes()});
    }
    if (canceller != nullptr && canceller->cancelled()) return absl::CancelledError("cancelled");
    peer::SnapshotStore* store = Find(address);
    if (store == nullptr) return absl::UnavailableError(absl::StrCat("no peer at ", address));
    absl::StatusOr<peer::SnapshotStore::Served> served = store->Serve(request);
    if (!served.ok()) return served.status();
    if (absl::Status s = peer::CheckSnapshotMeta(served->meta, request, expected); !s.ok()) {
      return s;
    }
    tensor::FrameDecoder decoder =
        tensor::FrameDecoder::ForLayout(expected, true, std::move(buffer));
    tensor::FrameEncoder encoder(*served->model, tensor::kDefaultChunkBytes);
    common::v1::TensorFrame frame;
    while (encoder.Next(&frame)) {
      if (absl::Status s = decoder.Add(frame); !s.ok()) return s;
    }
    absl::StatusOr<tensor::FlatModel> model = std::move(decoder).Finish();
    if (!model.ok()) return model.status();
    return tensor::ReceivedModel{std::move(served->meta), *std::move(model)};
  }

  absl::Status Probe(const std::string& address, const peer::v1::ProbeRequest&, absl::Time,
                     peer::CallCanceller* canceller) override {
    if (canceller != nullptr && canceller->cancelled()) return absl::CancelledError("cancelled");
    if (Find(address) == nullptr)
      return absl::UnavailableError(absl::StrCat("no peer at ", address));
    return absl::OkStatus();
  }

  void Forget(const std::string&) override {}

  std::vector<RecordedFetch> fetches() const {
    absl::MutexLock lock(&mu_);
    return fetches_;
  }

 private:
  peer::SnapshotStore* Find(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(address);
    return it == stores_.end() ? nullptr : it->second;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, peer::SnapshotStore*> stores_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedFetch> fetches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::fakes
