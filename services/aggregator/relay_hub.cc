#include "services/aggregator/relay_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal::aggregator {

uint64_t RelayHub::Attach(const std::string& peer_id, std::shared_ptr<Stream> stream) {
  // The stream is listed at once, so that a peer told it is attached is found by every call
  // made from then on; call_id 0 (attached) still goes first: the calls made before it is sent
  // wait (Attached::waiting) and follow it. The peer reads its first message as the attachment.
  std::shared_ptr<Stream> replaced;
  std::vector<std::pair<Done, RelayResult>> failed;
  uint64_t token = 0;
  {
    absl::MutexLock lock(&mu_);
    token = next_token_++;
    auto it = by_peer_.find(peer_id);
    if (it != by_peer_.end()) {
      const uint64_t old = it->second;
      replaced = streams_[old].stream;
      FailStreamCallsLocked(old, absl::UnavailableError("its relay stream was replaced"), failed);
      streams_.erase(old);
    }
    by_peer_[peer_id] = token;
    streams_[token] = Attached{peer_id, stream, 0, /*attaching=*/true, {}};
    metrics_.relay_streams.Set(static_cast<double>(streams_.size()));
  }
  stream->Send(peer::v1::RelayCall());
  std::vector<peer::v1::RelayCall> waiting;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(token);
    if (it != streams_.end()) {  // else detached or replaced meanwhile: its calls have failed
      it->second.attaching = false;
      waiting = std::move(it->second.waiting);
    }
  }
  for (const peer::v1::RelayCall& call : waiting) stream->Send(call);
  for (auto& [done, result] : failed) done(std::move(result));
  if (replaced != nullptr) {
    replaced->Close(absl::UnavailableError(absl::StrCat(
        "a newer relay stream of peer '", EscapeBytes(peer_id), "' replaced this one")));
  }
  return token;
}

void RelayHub::Detach(uint64_t token) {
  std::vector<std::pair<Done, RelayResult>> failed;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(token);
    if (it == streams_.end()) return;
    FailStreamCallsLocked(token, absl::UnavailableError("its relay stream ended"), failed);
    auto peer = by_peer_.find(it->second.peer_id);
    if (peer != by_peer_.end() && peer->second == token) by_peer_.erase(peer);
    streams_.erase(it);
    metrics_.relay_streams.Set(static_cast<double>(streams_.size()));
  }
  for (auto& [done, result] : failed) done(std::move(result));
}

uint64_t RelayHub::Call(const std::string& peer_id, peer::v1::RelayCall call, Done done,
                        OnChunk on_chunk) {
  std::shared_ptr<Stream> stream;
  absl::Status refused;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    id = next_call_++;
    auto it = by_peer_.find(peer_id);
    if (it == by_peer_.end()) {
      metrics_.relay_calls_no_stream.Increment();
      refused = absl::NotFoundError(absl::StrCat("peer '", EscapeBytes(peer_id),
                                                 "' keeps no relay stream at this aggregator"));
    } else if (Attached& attached = streams_[it->second];
               attached.calls >= options_.max_calls_per_peer) {
      metrics_.relay_calls_failed.Increment();
      refused = absl::ResourceExhaustedError(
          absl::StrCat("peer '", EscapeBytes(peer_id), "' already has ",
                       options_.max_calls_per_peer, " relayed calls in flight; retry later"));
    } else {
      ++attached.calls;
      call.set_call_id(id);
      calls_[id] = PendingCall{
          it->second, call.has_get_snapshot(), std::move(done), std::move(on_chunk), {}};
      if (attached.attaching) {
        attached.waiting.push_back(std::move(call));  // Attach sends it after call_id 0
        return id;
      }
      stream = attached.stream;
    }
  }
  if (stream == nullptr) {
    RelayResult result;
    result.status = std::move(refused);
    done(std::move(result));
    return id;
  }
  stream->Send(call);
  return id;
}

void RelayHub::Sent(uint64_t call_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(call_id);
  if (it == held_.end()) return;  // released already
  const uint64_t n = std::min(bytes, it->second);
  it->second -= n;
  held_bytes_ -= n;
}

void RelayHub::ReleaseLocked(uint64_t call_id) {
  auto it = held_.find(call_id);
  if (it == held_.end()) return;
  held_bytes_ -= it->second;
  held_.erase(it);
}

bool RelayHub::Abandon(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  ReleaseLocked(call_id);
  if (calls_.count(call_id) == 0) return false;
  TakeLocked(call_id, absl::CancelledError("abandoned"));  // dropped: `done` never runs
  return true;
}

absl::Status RelayHub::OnReply(uint64_t token, peer::v1::RelayReply reply) {
  std::pair<Done, RelayResult> finished;
  OnChunk on_chunk;  // with the chunk, when it goes on
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(reply.call_id());
    // A call the caller abandoned, or that failed here (too large): its rest is dropped.
    if (it == calls_.end()) return absl::OkStatus();
    PendingCall& call = it->second;
    if (call.token != token) {
      return absl::InvalidArgumentError(
          absl::StrCat("reply to call ", reply.call_id(), ", which is not this stream's"));
    }
    switch (reply.reply_case()) {
      case peer::v1::RelayReply::kChunk:
        if (!call.snapshot) {
          return absl::InvalidArgumentError(
              absl::StrCat("a snapshot chunk for call ", reply.call_id(), ", a probe"));
        }
        {
          uint64_t& held = held_[reply.call_id()];
          if (held + reply.chunk().size() > options_.max_call_bytes) {
            metrics_.relay_calls_failed.Increment();
            finished = TakeLocked(reply.call_id(),
                                  absl::ResourceExhaustedError(absl::StrCat(
                                      "the relay would hold more than ", options_.max_call_bytes,
                                      " bytes of the snapshot that the caller has not taken yet")));
            break;
          }
          if (held_bytes_ + reply.chunk().size() > options_.max_total_bytes) {
            metrics_.relay_calls_failed.Increment();
            finished = TakeLocked(
                reply.call_id(),
                absl::ResourceExhaustedError(absl::StrCat(
                    "the relay holds ", held_bytes_, " bytes of snapshots in flight (limit ",
                    options_.max_total_bytes, "); retry later")));
            break;
          }
          call.result.bytes += reply.chunk().size();
          held += reply.chunk().size();
          held_bytes_ += reply.chunk().size();
          on_chunk = call.on_chunk;
          break;
        }
      case peer::v1::RelayReply::kProbe:
        if (call.snapshot) {
          return absl::InvalidArgumentError(
              absl::StrCat("a probe answer for call ", reply.call_id(), ", a snapshot"));
        }
        call.result.probe = reply.probe();
        metrics_.relay_calls_relayed.Increment();
        finished = TakeLocked(reply.call_id(), absl::OkStatus());
        break;
      case peer::v1::RelayReply::kEnd: {
        const int code = reply.end().code();
        if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
          return absl::InvalidArgumentError(
              absl::StrCat("call ", reply.call_id(), " ended with an unknown code ", code));
        }
        metrics_.relay_calls_relayed.Increment();
        if (code == 0) {
          metrics_.relay_bytes.Increment(static_cast<double>(call.result.bytes));
          finished = TakeLocked(reply.call_id(), absl::OkStatus());
        } else {
          finished = TakeLocked(reply.call_id(), absl::Status(static_cast<absl::StatusCode>(code),
                                                              reply.end().message()));
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("reply to call ", reply.call_id(), " holds no chunk, probe or end"));
    }
  }
  // Both run on the stream's read path, one reply at a time: the chunks go on in order, and
  // before the call's end.
  if (on_chunk) on_chunk(std::move(*reply.mutable_chunk()));
  if (finished.first) finished.first(std::move(finished.second));
  return absl::OkStatus();
}

size_t RelayHub::streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

std::pair<RelayHub::Done, RelayResult> RelayHub::TakeLocked(uint64_t id, absl::Status status) {
  auto it = calls_.find(id);
  auto stream = streams_.find(it->second.token);
  if (stream != streams_.end()) --stream->second.calls;
  std::pair<Done, RelayResult> out{std::move(it->second.done), std::move(it->second.result)};
  out.second.status = std::move(status);
  if (!out.second.status.ok()) ReleaseLocked(id);
  calls_.erase(it);
  return out;
}

void RelayHub::FailStreamCallsLocked(uint64_t token, const absl::Status& status,
                                     std::vector<std::pair<Done, RelayResult>>& out) {
  std::vector<uint64_t> ids;
  for (const auto& [id, call] : calls_) {
    if (call.token == token) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    metrics_.relay_calls_failed.Increment();
    out.push_back(TakeLocked(id, status));
  }
}

}  // namespace shoal::aggregator
