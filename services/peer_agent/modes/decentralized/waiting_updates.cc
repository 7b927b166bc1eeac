#include "services/peer_agent/modes/decentralized/waiting_updates.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::peer {

namespace {

absl::Status NamingPeer(const absl::Status& s, const std::string& peer_id, const char* what) {
  return absl::Status(s.code(),
                      absl::StrCat(what, " the update of peer ", peer_id, ": ", s.message()));
}

}  // namespace

absl::Status WaitingUpdates::Put(PeerUpdate update) {
  const std::string id = update.peer_id;
  Held held;
  const size_t bytes = update.model->values.size() * sizeof(float);
  // Held elsewhere too (use_count > 1): writing it out would free nothing.
  if (update.model.use_count() > 1) {
    held.update = std::move(update);
  } else if (memory_held_ + bytes <= options_.memory_bytes) {
    held.counted_bytes = bytes;
    held.update = std::move(update);
  } else {
    absl::StatusOr<tensor::SpillFile> file = tensor::SpillFile::Create(options_.spill_dir);
    if (!file.ok()) return NamingPeer(file.status(), id, "cannot hold");
    if (absl::Status s = file->Write(update.model->values); !s.ok()) {
      return NamingPeer(s, id, "cannot hold");
    }
    held.layout = update.model->layout;
    held.file.emplace(*std::move(file));
    update.model.reset();
    held.update = std::move(update);
    ++spilled_;
  }
  memory_held_ += held.counted_bytes;
  held_.insert_or_assign(id, std::move(held));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PeerUpdate>> WaitingUpdates::Take(const std::string& peer_id) {
  auto it = held_.find(peer_id);
  if (it == held_.end()) return std::nullopt;
  Held held = std::move(it->second);
  held_.erase(it);
  memory_held_ -= held.counted_bytes;
  if (!held.file) return std::move(held.update);
  std::vector<float> values = options_.buffers ? options_.buffers->Take() : std::vector<float>();
  values.resize(held.file->size());
  if (absl::Status s = held.file->Read(absl::MakeSpan(values)); !s.ok()) {
    return NamingPeer(s, peer_id, "cannot read back");
  }
  tensor::FlatModel model{std::move(held.layout), std::move(values)};
  held.update.model = options_.buffers
                          ? options_.buffers->Share(std::move(model))
                          : std::make_shared<const tensor::FlatModel>(std::move(model));
  return std::move(held.update);
}

void WaitingUpdates::Clear() {
  held_.clear();
  memory_held_ = 0;
  spilled_ = 0;
}

}  // namespace shoal::peer
