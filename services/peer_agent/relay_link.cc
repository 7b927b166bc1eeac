#include "services/peer_agent/relay_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/log.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/status.h"
#include "libs/tensor/compression.h"
#include "shoal/peer/v1/peer.grpc.pb.h"

namespace shoal::peer {
namespace {

using Stream = grpc::ClientReaderWriter<v1::RelayReply, v1::RelayCall>;

v1::RelayReply EndOf(uint64_t call_id, const absl::Status& status) {
  v1::RelayReply reply;
  reply.set_call_id(call_id);
  reply.mutable_end()->set_code(static_cast<int>(status.code()));
  reply.mutable_end()->set_message(std::string(status.message()));
  return reply;
}

std::string Flatten(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!message.Dump(&slices).ok()) return out;
  out.reserve(message.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Answers one GetSnapshot as PeerServiceImpl would: ModelMeta, the frames, then the end. False
// when a write failed (the stream broke).
bool ServeSnapshot(Stream& stream, uint64_t call_id, const v1::GetSnapshotRequest& request,
                   const SnapshotStore& store, PeerMetrics& metrics) {
  absl::StatusOr<SnapshotStore::Served> served = store.Serve(request);
  if (!served.ok()) return stream.Write(EndOf(call_id, served.status()));
  v1::RelayReply reply;
  reply.set_call_id(call_id);
  common::v1::ModelChunk first;
  *first.mutable_meta() = served->meta;
  reply.set_chunk(first.SerializeAsString());
  uint64_t bytes = reply.chunk().size();
  if (!stream.Write(reply)) return false;
  rpc::ZeroCopyFrames frames(std::move(served->model));
  grpc::ByteBuffer message;
  while (frames.Next(&message)) {
    reply.set_chunk(Flatten(message));
    bytes += reply.chunk().size();
    if (!stream.Write(reply)) {
      metrics.snapshots_aborted.Increment();
      return false;
    }
  }
  metrics.bytes_sent.Increment(static_cast<double>(bytes));
  metrics.snapshots_served.Increment();
  return stream.Write(EndOf(call_id, absl::OkStatus()));
}

}  // namespace

RelayLink::RelayLink(RelayLinkOptions options, const SnapshotStore& store, PeerMetrics& metrics)
    : options_(std::move(options)), store_(store), metrics_(metrics) {
  thread_ = std::thread([this] { Loop(); });
}

RelayLink::~RelayLink() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  thread_.join();
}

absl::Status RelayLink::WaitAttached(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return attached_ || stopping_ || absl::IsPermissionDenied(last_error_) ||
           absl::IsInvalidArgument(last_error_);
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (attached_) return absl::OkStatus();
  const std::string what = absl::StrCat("relay ", options_.relay, ": ", last_error_.message());
  if (absl::IsPermissionDenied(last_error_) || absl::IsInvalidArgument(last_error_)) {
    return absl::Status(last_error_.code(), what);
  }
  return absl::DeadlineExceededError(absl::StrCat("no relay stream yet: ", what));
}

void RelayLink::Loop() {
  const absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration backoff = first_backoff;
  bool logged = false;   // this outage
  bool gave_up = false;  // this outage
  absl::Time down_since = absl::Now();
  while (true) {
    bool attached = false;
    absl::Status s = RunStream(&attached);
    const absl::Time now = absl::Now();
    if (attached) {
      backoff = first_backoff;
      logged = gave_up = false;
      down_since = now;
    }
    bool give_up = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      last_error_ = s;
      if (!logged) {
        LogWarning("relay ", options_.relay, ": ", s.message(), " (reconnecting)");
        logged = true;
      }
      if (!gave_up && options_.on_give_up && options_.give_up_after > absl::ZeroDuration() &&
          now - down_since >= options_.give_up_after) {
        LogWarning("relay ", options_.relay, ": no stream for ",
                   absl::FormatDuration(now - down_since), "; asking for another relay");
        give_up = gave_up = true;
      }
    }
    if (give_up) options_.on_give_up();
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status RelayLink::RunStream(bool* attached) {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    context_ = &context;
  }
  auto stub = v1::RelayService::NewStub(options_.credentials != nullptr
                                            ? rpc::MakeChannel(options_.relay, options_.credentials)
                                            : rpc::MakeChannel(options_.relay));
  std::unique_ptr<Stream> stream = stub->Relay(&context);
  v1::RelayReply open;
  open.mutable_open()->set_peer_id(options_.peer_id);
  v1::RelayCall call;
  bool ok = stream->Write(open) && stream->Read(&call);
  absl::Status broken;  // the relay broke the protocol
  if (ok && call.call_id() != 0) {
    broken = absl::InternalError(absl::StrCat("the relay's first message was call ", call.call_id(),
                                              ", not the attachment (call 0)"));
    context.TryCancel();
    ok = false;
  } else if (ok) {
    absl::MutexLock lock(&mu_);
    if (!attached_) {
      LogInfo("relayed through ", options_.relay, " as '", EscapeBytes(options_.peer_id), "'");
    }
    attached_ = *attached = true;
    last_error_ = absl::OkStatus();
  }
  while (ok && stream->Read(&call)) {
    if (call.has_get_snapshot()) {
      ok = ServeSnapshot(*stream, call.call_id(), call.get_snapshot(), store_, metrics_);
    } else if (call.has_probe()) {
      v1::RelayReply reply;
      reply.set_call_id(call.call_id());
      reply.mutable_probe()->set_peer_id(options_.peer_id);
      ok = stream->Write(reply);
    } else {
      ok = stream->Write(EndOf(call.call_id(), absl::UnimplementedError("unknown relayed call")));
    }
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  if (!broken.ok()) return broken;
  if (status.ok()) return absl::UnavailableError("the relay ended the stream");
  return rpc::FromGrpcStatus(status);
}

}  // namespace shoal::peer
