#include "libs/rpc/model_stream.h"

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/rpc/status.h"

namespace shoal::rpc {

using common::v1::ModelChunk;
using common::v1::ModelMeta;

namespace {

template <typename Request, typename Meta>
absl::Status WriteModel(grpc::ClientWriterInterface<Request>& writer, const Meta& meta,
                        const tensor::FlatModel& model, size_t chunk_bytes) {
  Request request;
  *request.mutable_meta() = meta;
  bool ok = writer.Write(request);
  if (ok) {
    tensor::FrameEncoder encoder(model, chunk_bytes);
    while (encoder.Next(request.mutable_frame())) {
      if (!writer.Write(request)) {
        ok = false;  // the server ended the call; Finish() says why
        break;
      }
    }
  }
  if (ok) writer.WritesDone();
  // When the server ends the call early (an error, or OK for a duplicate push) its status is
  // the answer.
  return FromGrpcStatus(writer.Finish());
}

}  // namespace

namespace {

// A model stream's state on the reading side: the ModelMeta first, then frames.
class ModelStreamSink {
 public:
  explicit ModelStreamSink(const MakeDecoder& make_decoder) : make_decoder_(make_decoder) {}

  absl::Status Add(const ModelChunk& chunk) {
    if (!decoder_.has_value()) {
      if (chunk.item_case() != ModelChunk::kMeta) return NoMeta();
      received_.meta = chunk.meta();
      absl::StatusOr<tensor::FrameDecoder> d = make_decoder_(received_.meta);
      if (!d.ok()) return d.status();
      decoder_.emplace(*std::move(d));
      return absl::OkStatus();
    }
    if (chunk.item_case() != ModelChunk::kFrame) {
      return absl::InvalidArgumentError("model stream carries a second ModelMeta");
    }
    return decoder_->Add(chunk.frame());
  }
  absl::Status AddChunkParts(absl::Span<const absl::string_view> parts) {
    if (!decoder_.has_value()) return NoMeta();
    return decoder_->AddChunkParts(parts);
  }
  absl::StatusOr<tensor::ReceivedModel> Finish() && {
    if (!decoder_.has_value()) {
      return absl::InvalidArgumentError("model stream ended before its ModelMeta");
    }
    received_.payload_bytes = decoder_->bytes_received();
    auto model = std::move(*decoder_).Finish();
    if (!model.ok()) return model.status();
    received_.model = *std::move(model);
    return std::move(received_);
  }
  uint64_t bytes_received() const { return decoder_ ? decoder_->bytes_received() : 0; }

 private:
  static absl::Status NoMeta() {
    return absl::InvalidArgumentError("model stream does not start with a ModelMeta");
  }

  const MakeDecoder& make_decoder_;
  tensor::ReceivedModel received_;
  std::optional<tensor::FrameDecoder> decoder_;
};

// Reads `reader` to the end through `feed(message, sink)`; see ReadModelStream.
template <typename Message, typename Feed>
absl::StatusOr<tensor::ReceivedModel> ReadAll(grpc::ClientReaderInterface<Message>& reader,
                                              const MakeDecoder& make_decoder,
                                              grpc::ClientContext* context, StreamStats* stats,
                                              Feed feed) {
  ModelStreamSink sink(make_decoder);
  Message message;
  absl::Status local;
  while (local.ok() && reader.Read(&message)) local = feed(message, sink);
  if (stats != nullptr) {
    stats->refused = !local.ok();
    stats->bytes_received = sink.bytes_received();
  }
  if (!local.ok()) {
    if (context != nullptr) {
      context->TryCancel();
    } else {
      while (reader.Read(&message)) {
      }
    }
    reader.Finish();
    return local;
  }
  grpc::Status status = reader.Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  absl::StatusOr<tensor::ReceivedModel> received = std::move(sink).Finish();
  if (stats != nullptr) stats->refused = !received.ok();
  return received;
}

MakeDecoder DecoderWithin(const tensor::DecoderLimits& limits, tensor::WriteValues write) {
  return [limits, write = std::move(write)](const ModelMeta& meta) {
    return tensor::FrameDecoder::ForMeta(meta, limits, /*require_finite=*/false, write);
  };
}

}  // namespace

absl::StatusOr<tensor::ReceivedModel> ReadModelStream(
    grpc::ClientReaderInterface<ModelChunk>& reader, const tensor::DecoderLimits& limits,
    grpc::ClientContext* context) {
  return ReadAll(reader, DecoderWithin(limits, nullptr), context, nullptr,
                 [](const ModelChunk& chunk, ModelStreamSink& sink) { return sink.Add(chunk); });
}

absl::StatusOr<tensor::ReceivedModel> ReadModelStream(
    grpc::ClientReaderInterface<grpc::ByteBuffer>& reader, const tensor::DecoderLimits& limits,
    grpc::ClientContext* context, tensor::WriteValues write) {
  return ReadModelStreamWith(reader, DecoderWithin(limits, std::move(write)), context);
}

absl::StatusOr<tensor::ReceivedModel> ReadModelStreamWith(
    grpc::ClientReaderInterface<grpc::ByteBuffer>& reader, const MakeDecoder& make_decoder,
    grpc::ClientContext* context, StreamStats* stats) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> parts;
  ModelChunk chunk;
  return ReadAll(
      reader, make_decoder, context, stats, [&](grpc::ByteBuffer& message, ModelStreamSink& sink) {
        if (ParseChunkMessage(message, &slices, &parts)) {
          absl::Status s = sink.AddChunkParts(parts);
          slices.clear();
          parts.clear();
          return s;
        }
        grpc::Status parsed =
            grpc::GenericDeserialize<grpc::ProtoBufferReader, ModelChunk>(&message, &chunk);
        if (!parsed.ok()) return absl::InvalidArgumentError("cannot parse ModelChunk");
        return sink.Add(chunk);
      });
}

std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> OpenRawReader(
    grpc::ChannelInterface& channel, const char* method, grpc::ClientContext& context,
    const google::protobuf::MessageLite& request) {
  grpc::ByteBuffer bytes;
  bool own = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(request, &bytes,
                                                                                 &own);
  const grpc::internal::RpcMethod rpc_method(method, grpc::internal::RpcMethod::SERVER_STREAMING);
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(&channel, rpc_method, &context,
                                                                    bytes));
}

absl::Status WritePutModel(grpc::ClientWriterInterface<aggregator::v1::PutModelRequest>& writer,
                           const ModelMeta& meta, const tensor::FlatModel& model,
                           size_t chunk_bytes) {
  return WriteModel(writer, meta, model, chunk_bytes);
}

absl::Status WritePushUpdate(grpc::ClientWriterInterface<aggregator::v1::PushUpdateRequest>& writer,
                             const aggregator::v1::UpdateMeta& meta, const tensor::FlatModel& model,
                             size_t chunk_bytes) {
  return WriteModel(writer, meta, model, chunk_bytes);
}

// ---------------------------------------------------------------------------------------------
// Zero-copy chunk messages.

namespace {

constexpr uint8_t kFrameFieldTag = (2 << 3) | 2;  // field 2 (frame), wire type LEN
constexpr uint8_t kChunkFieldTag = (2 << 3) | 2;  // TensorFrame field 2 (chunk), wire type LEN

size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

bool GetVarint(const uint8_t* p, size_t size, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < size; shift += 7) {
    const uint8_t b = p[(*pos)++];
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

bool ParseChunkMessage(const grpc::ByteBuffer& message, std::vector<grpc::Slice>* slices,
                       std::vector<absl::string_view>* parts) {
  slices->clear();
  parts->clear();
  if (!message.Dump(slices).ok()) return false;
  // The prefix (two tags and two varints) is at most 22 bytes; gather it across slices.
  uint8_t head[24];
  size_t have = 0;
  for (const grpc::Slice& s : *slices) {
    const size_t take = std::min(sizeof(head) - have, s.size());
    std::memcpy(head + have, s.begin(), take);
    have += take;
    if (have == sizeof(head)) break;
  }
  size_t pos = 0;
  uint64_t frame_len = 0, chunk_len = 0;
  if (have < 2 || head[pos++] != kFrameFieldTag) return false;
  if (!GetVarint(head, have, &pos, &frame_len)) return false;
  const size_t frame_start = pos;
  if (pos >= have || head[pos++] != kChunkFieldTag) return false;
  if (!GetVarint(head, have, &pos, &chunk_len)) return false;
  // The chunk must be the whole frame, and the frame the whole message.
  if (frame_len != (pos - frame_start) + chunk_len) return false;
  if (message.Length() != pos + chunk_len) return false;
  size_t skip = pos;
  for (const grpc::Slice& s : *slices) {
    if (skip >= s.size()) {
      skip -= s.size();
      continue;
    }
    parts->emplace_back(reinterpret_cast<const char*>(s.begin()) + skip, s.size() - skip);
    skip = 0;
  }
  return true;
}

namespace {

void ReleaseModelRef(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

grpc::ByteBuffer Serialize(const google::protobuf::MessageLite& m) {
  grpc::ByteBuffer bb;
  bool own = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(m, &bb, &own);
  return bb;
}

// Tensors at least this large are hashed on a helper thread, one ahead of the send.
constexpr size_t kAsyncDigestBytes = 4 << 20;

}  // namespace

ZeroCopyFrames::ZeroCopyFrames(std::shared_ptr<const tensor::EncodedModel> model,
                               size_t chunk_bytes)
    : model_(std::move(model)),
      layout_(model_->layout),
      tensors_(model_->payloads),
      encodings_(model_->encodings),
      chunk_(chunk_bytes == 0 ? tensor::kDefaultChunkBytes
                              : std::min(chunk_bytes, tensor::kMaxChunkBytes)) {
  if (!tensors_.empty()) StartDigest(0);
}

ZeroCopyFrames::~ZeroCopyFrames() {
  if (next_digest_.valid()) next_digest_.wait();
}

void ZeroCopyFrames::StartDigest(size_t t) {
  if (!model_->digests.empty()) {
    std::promise<uint64_t> given;
    given.set_value(model_->digests[t]);
    next_digest_ = given.get_future();
    return;
  }
  const absl::string_view bytes = tensors_[t];
  next_digest_ =
      std::async(bytes.size() >= kAsyncDigestBytes ? std::launch::async : std::launch::deferred,
                 [bytes] { return tensor::DigestBytes(bytes.data(), bytes.size()); });
}

bool ZeroCopyFrames::Next(grpc::ByteBuffer* message) {
  const tensor::ModelLayout& layout = layout_;
  if (tensor_ >= layout.num_tensors()) return false;
  const absl::string_view bytes = tensors_[tensor_];
  if (!header_sent_) {
    const tensor::TensorSpec& spec = layout.tensors()[tensor_];
    const uint64_t digest = next_digest_.get();
    if (tensor_ + 1 < layout.num_tensors()) StartDigest(tensor_ + 1);
    ModelChunk frame;  // same wire shape as PutModelRequest and PushUpdateRequest
    tensor::SetTensorHeader(spec, bytes.size(), digest, frame.mutable_frame()->mutable_header());
    encodings_[tensor_].ToHeader(frame.mutable_frame()->mutable_header());
    *message = Serialize(frame);
    header_sent_ = true;
    offset_ = 0;
  } else {
    const size_t n = std::min(chunk_, bytes.size() - offset_);
    uint8_t head[24];
    size_t pos = 0;
    head[pos++] = kFrameFieldTag;
    uint8_t varint[10];
    const size_t varint_len = PutVarint(n, varint);
    pos += PutVarint(1 + varint_len + n, head + pos);
    head[pos++] = kChunkFieldTag;
    std::memcpy(head + pos, varint, varint_len);
    pos += varint_len;
    grpc::Slice slices[2] = {
        grpc::Slice(head, pos),
        grpc::Slice(const_cast<char*>(bytes.data() + offset_), n, &ReleaseModelRef,
                    new std::shared_ptr<const void>(model_))};
    *message = grpc::ByteBuffer(slices, 2);
    offset_ += n;
  }
  if (offset_ == bytes.size()) {  // the header of an empty tensor, or its last chunk
    ++tensor_;
    header_sent_ = false;
  }
  return true;
}

ModelWriteReactor::ModelWriteReactor(std::shared_ptr<const tensor::EncodedModel> model,
                                     const ModelMeta& meta, DoneCallback on_done,
                                     size_t chunk_bytes, Pacer* pacer)
    : ModelWriteReactor(std::move(on_done), chunk_bytes, pacer) {
  Start(std::move(model), meta);
}

ModelWriteReactor::ModelWriteReactor(DoneCallback on_done, size_t chunk_bytes, Pacer* pacer)
    : chunk_bytes_(chunk_bytes), pacer_(pacer), on_done_(std::move(on_done)) {}

void ModelWriteReactor::Start(std::shared_ptr<const tensor::EncodedModel> model,
                              const ModelMeta& meta) {
  frames_.emplace(std::move(model), chunk_bytes_);
  StartMeta(meta);
}

void ModelWriteReactor::StartMeta(const ModelMeta& meta) {
  ModelChunk first;
  *first.mutable_meta() = meta;
  message_ = Serialize(first);
  Write();
}

void ModelWriteReactor::Write() {
  pending_bytes_ = message_.Length();
  const absl::Duration wait =
      pacer_ != nullptr ? pacer_->Reserve(pending_bytes_) : absl::ZeroDuration();
  if (wait <= absl::ZeroDuration()) {
    StartWrite(&message_);
    return;
  }
  // A new alarm for each wait: the write it starts may complete, and the next wait begin, on
  // another thread while this alarm's callback is still returning, and an alarm is not re-armed
  // while its callback runs (the one replaced goes once that callback is done). The callback
  // runs once, at the deadline (ok), or earlier when the alarm is cancelled (not ok), which only
  // its destruction does, never before the write it waits for.
  alarm_ = std::make_unique<grpc::Alarm>();
  alarm_->Set(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(wait), [this](bool ok) {
    if (ok) {
      StartWrite(&message_);
    } else {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "model stream stopped"));
    }
  });
}

void ModelWriteReactor::OnWriteDone(bool ok) {
  if (!ok) {
    // The client went away or the call was cancelled; the status is not delivered anyway.
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "model stream write failed"));
    return;
  }
  bytes_sent_ += pending_bytes_;
  if (!frames_->Next(&message_)) {
    completed_ = true;
    Finish(grpc::Status::OK);
    return;
  }
  Write();
}

void ModelWriteReactor::OnDone() {
  if (on_done_) on_done_(bytes_sent_, completed_);
  delete this;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* MakeFailedModelWriteReactor(
    const grpc::Status& status) {
  class Failed : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Failed(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  return new Failed(status);
}

bool ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::MessageLite* out) {
  grpc::ByteBuffer copy = raw;  // deserializing consumes the buffer (the copy shares its slices)
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(&copy,
                                                                                          out)
      .ok();
}

absl::Status WriteModelZeroCopy(grpc::ChannelInterface& channel, const char* method,
                                grpc::ClientContext& context,
                                const google::protobuf::MessageLite& first_message,
                                std::shared_ptr<const tensor::EncodedModel> model,
                                google::protobuf::MessageLite* response, size_t chunk_bytes) {
  grpc::ByteBuffer reply;
  const grpc::internal::RpcMethod rpc_method(method, grpc::internal::RpcMethod::CLIENT_STREAMING);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(&channel, rpc_method, &context,
                                                                    &reply));
  bool ok = writer->Write(Serialize(first_message));
  ZeroCopyFrames frames(std::move(model), chunk_bytes);
  grpc::ByteBuffer message;
  while (ok && frames.Next(&message)) ok = writer->Write(message);
  if (ok) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  grpc::Status parsed =
      grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(&reply,
                                                                                       response);
  if (!parsed.ok()) return absl::InternalError("cannot parse the server's reply");
  return absl::OkStatus();
}

absl::StatusOr<aggregator::v1::PushUpdateResponse> PushUpdateZeroCopy(
    grpc::ChannelInterface& channel, grpc::ClientContext& context,
    const aggregator::v1::UpdateMeta& meta, std::shared_ptr<const tensor::EncodedModel> delta,
    size_t chunk_bytes) {
  aggregator::v1::PushUpdateRequest first;
  *first.mutable_meta() = meta;
  aggregator::v1::PushUpdateResponse response;
  absl::Status s = WriteModelZeroCopy(channel, "/shoal.aggregator.v1.AggregatorService/PushUpdate",
                                      context, first, std::move(delta), &response, chunk_bytes);
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<aggregator::v1::PutModelResponse> PutModelZeroCopy(
    grpc::ChannelInterface& channel, grpc::ClientContext& context,
    const aggregator::v1::PutModelRequest& first, std::shared_ptr<const tensor::EncodedModel> model,
    size_t chunk_bytes) {
  aggregator::v1::PutModelResponse response;
  absl::Status s = WriteModelZeroCopy(channel, "/shoal.aggregator.v1.AggregatorService/PutModel",
                                      context, first, std::move(model), &response, chunk_bytes);
  if (!s.ok()) return s;
  return response;
}

void TuneAllocatorForModelStreams() {
  // Fixed thresholds (which also turn off glibc's dynamic adjustment): allocations up to 16 MiB
  // come from the heap, and up to 256 MiB of free heap top is kept instead of trimmed.
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace shoal::rpc
