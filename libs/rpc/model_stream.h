#pragma once

// gRPC glue for chunked model streams (ModelMeta/UpdateMeta first, then TensorFrames), shared
// by the aggregator (serves models, receives updates), the peer (pushes deltas, pulls models)
// and the coordinator/shoalctl (download/restore models).

#include <google/protobuf/message_lite.h>
#include <grpcpp/alarm.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/rpc/pacer.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/flat_model.h"
#include "libs/tensor/frame_codec.h"
#include "libs/tensor/model_file.h"
#include "shoal/aggregator/v1/aggregator.pb.h"
#include "shoal/common/v1/model.pb.h"

namespace shoal::rpc {

// The frames of `model` as chunk-stream messages (PutModelRequest, PushUpdateRequest and
// ModelChunk all hold their TensorFrame in field 2) without copying chunk bytes in user space:
// a header is a small serialized message; a chunk message is a prefix slice plus a slice of
// `model`'s memory, which `model` (shared) keeps alive for as long as gRPC holds it. A header
// carries its tensor's digest, so tensors of 4 MiB and more are hashed one ahead on a helper
// thread, overlapping the send of the tensor before.
class ZeroCopyFrames {
 public:
  // Each header carries its tensor's encoding. A model in memory or a mapped model file travels
  // raw through tensor::EncodeRaw, its chunks slices of the model's memory or the file's pages.
  explicit ZeroCopyFrames(std::shared_ptr<const tensor::EncodedModel> model,
                          size_t chunk_bytes = tensor::kDefaultChunkBytes);
  ~ZeroCopyFrames();  // waits for a digest in progress
  ZeroCopyFrames(const ZeroCopyFrames&) = delete;
  ZeroCopyFrames& operator=(const ZeroCopyFrames&) = delete;

  // Sets `message` to the next frame; false once every frame is out.
  bool Next(grpc::ByteBuffer* message);

 private:
  void StartDigest(size_t t);

  // Keeps the bytes alive, also while gRPC holds slices of them.
  const std::shared_ptr<const tensor::EncodedModel> model_;
  const tensor::ModelLayout& layout_;                     // model_'s
  const std::vector<absl::string_view>& tensors_;         // model_'s payloads
  const std::vector<tensor::TensorEncoding>& encodings_;  // model_'s
  const size_t chunk_;
  size_t tensor_ = 0;
  size_t offset_ = 0;  // bytes of the current tensor sent
  bool header_sent_ = false;
  std::future<uint64_t> next_digest_;  // of the tensor whose header is next
};

// Serves one model as a server stream from a raw (ByteBuffer) handler (a service's
// WithRawCallbackMethod_...): `meta`, then the frames of `model` from ZeroCopyFrames, so the
// model is never copied into protobuf messages; a client reads it like any ModelChunk stream.
// Never blocks: each write is started from the previous write's completion. Reads the shared
// immutable snapshot, so the owner may publish a new version meanwhile. Created with `new` and
// returned from the handler; deletes itself in OnDone(). `on_done(bytes_sent, completed)`
// (optional) runs once when the call ends, e.g. to count bytes in a metric; `completed` is false
// when the client went away before the whole model was sent.
class ModelWriteReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using DoneCallback = std::function<void(uint64_t bytes_sent, bool completed)>;

  // With `pacer` (which must outlive the call), each message waits for its time on the uplink
  // (Pacer::Reserve) before it is written: an alarm, no thread blocked.
  ModelWriteReactor(std::shared_ptr<const tensor::EncodedModel> model,
                    const common::v1::ModelMeta& meta, DoneCallback on_done = nullptr,
                    size_t chunk_bytes = tensor::kDefaultChunkBytes, Pacer* pacer = nullptr);
  // A reactor whose model is not at hand yet (e.g. read from disk on an executor): exactly one of
  // Start() and Fail() must follow, from any thread.
  explicit ModelWriteReactor(DoneCallback on_done = nullptr,
                             size_t chunk_bytes = tensor::kDefaultChunkBytes,
                             Pacer* pacer = nullptr);
  void Start(std::shared_ptr<const tensor::EncodedModel> model, const common::v1::ModelMeta& meta);
  void Fail(const grpc::Status& status) { Finish(status); }

  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void OnCancel() override {}

 private:
  const size_t chunk_bytes_;
  Pacer* const pacer_;
  std::unique_ptr<grpc::Alarm> alarm_;                // a paced message's wait
  void StartMeta(const common::v1::ModelMeta& meta);  // writes `meta`, the first message
  void Write();  // writes message_, once its time has come when paced

  std::optional<ZeroCopyFrames> frames_;  // set by Start()
  DoneCallback on_done_;
  grpc::ByteBuffer message_;    // the message being written
  uint64_t pending_bytes_ = 0;  // its size
  uint64_t bytes_sent_ = 0;
  bool completed_ = false;
};

// A reactor that immediately finishes the call with `status` (e.g. NOT_FOUND). Self-deleting.
grpc::ServerWriteReactor<grpc::ByteBuffer>* MakeFailedModelWriteReactor(const grpc::Status& status);

// Parses the request of a raw handler. False when it is not a valid `out`.
bool ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::MessageLite* out);

// Reads a whole model stream (ModelMeta first, then frames), decoding and verifying it within
// `limits`, then finishes the call. The call's own error status (e.g. NOT_FOUND from the server,
// DEADLINE_EXCEEDED) is returned through FromGrpcStatus; a malformed stream is INVALID_ARGUMENT.
// On a local decode error the call is cancelled through `context` when given, else the rest of
// the stream is drained before Finish().
absl::StatusOr<tensor::ReceivedModel> ReadModelStream(
    grpc::ClientReaderInterface<common::v1::ModelChunk>& reader,
    const tensor::DecoderLimits& limits, grpc::ClientContext* context = nullptr);
// The same from a raw reader (OpenRawReader): chunk messages are decoded straight from the
// received slices (ParseChunkMessage), one copy of each byte instead of three. With `write`, the
// values go there as they arrive and the model returned has none (FrameDecoder::ForMeta).
absl::StatusOr<tensor::ReceivedModel> ReadModelStream(
    grpc::ClientReaderInterface<grpc::ByteBuffer>& reader, const tensor::DecoderLimits& limits,
    grpc::ClientContext* context = nullptr, tensor::WriteValues write = nullptr);
// Chooses a stream's decoder from its ModelMeta, e.g. after checking the meta against what was
// asked for and with the layout expected (FrameDecoder::ForLayout); an error refuses the stream.
using MakeDecoder =
    std::function<absl::StatusOr<tensor::FrameDecoder>(const common::v1::ModelMeta&)>;
// What ReadModelStream saw, for metrics.
struct StreamStats {
  bool refused = false;         // refused here (malformed, or the decoder's error), not by the call
  uint64_t bytes_received = 0;  // payload bytes decoded
};
// The same with the decoder `make_decoder` returns.
absl::StatusOr<tensor::ReceivedModel> ReadModelStreamWith(
    grpc::ClientReaderInterface<grpc::ByteBuffer>& reader, const MakeDecoder& make_decoder,
    grpc::ClientContext* context, StreamStats* stats = nullptr);
// Starts the server-streaming call `method` (e.g. "/shoal.aggregator.v1.AggregatorService/
// GetModel") with `request`, its messages read raw.
std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> OpenRawReader(
    grpc::ChannelInterface& channel, const char* method, grpc::ClientContext& context,
    const google::protobuf::MessageLite& request);

// Writes `meta` and then the frames of `model` on a client stream, then WritesDone() and
// Finish(); returns the call's status. The response message is the one the caller gave to the
// stub. Frames are encoded straight from `model`, reusing one request message.
absl::Status WritePutModel(grpc::ClientWriterInterface<aggregator::v1::PutModelRequest>& writer,
                           const common::v1::ModelMeta& meta, const tensor::FlatModel& model,
                           size_t chunk_bytes = tensor::kDefaultChunkBytes);
absl::Status WritePushUpdate(grpc::ClientWriterInterface<aggregator::v1::PushUpdateRequest>& writer,
                             const aggregator::v1::UpdateMeta& meta, const tensor::FlatModel& model,
                             size_t chunk_bytes = tensor::kDefaultChunkBytes);

// ---------------------------------------------------------------------------------------------
// Zero-copy fast paths for the 1 MiB chunk messages, which carry nearly all the bytes.
// PutModelRequest, PushUpdateRequest and ModelChunk all hold their TensorFrame in field 2.

// When `message` is exactly such a request holding a chunk frame (and nothing else), sets
// `parts` to the chunk's bytes, pointing into `slices` (which keep them alive), and returns
// true. Otherwise returns false and the caller parses the message with protobuf.
bool ParseChunkMessage(const grpc::ByteBuffer& message, std::vector<grpc::Slice>* slices,
                       std::vector<absl::string_view>* parts);

// Streams `meta` and then `model`'s frames on a client-streaming call to `method` (e.g.
// "/shoal.aggregator.v1.AggregatorService/PushUpdate") without copying chunk bytes in user
// space: each chunk message is a small header slice plus a slice of `model`'s memory, which
// `model` (shared) keeps alive for as long as gRPC holds it. Then WritesDone() and Finish();
// parses the reply into `response`. Returns the call's status.
absl::Status WriteModelZeroCopy(grpc::ChannelInterface& channel, const char* method,
                                grpc::ClientContext& context,
                                const google::protobuf::MessageLite& first_message,
                                std::shared_ptr<const tensor::EncodedModel> model,
                                google::protobuf::MessageLite* response,
                                size_t chunk_bytes = tensor::kDefaultChunkBytes);

// PushUpdate / PutModel over `channel` with WriteModelZeroCopy; the fastest way to ship a delta
// (raw or compressed).
absl::StatusOr<aggregator::v1::PushUpdateResponse> PushUpdateZeroCopy(
    grpc::ChannelInterface& channel, grpc::ClientContext& context,
    const aggregator::v1::UpdateMeta& meta, std::shared_ptr<const tensor::EncodedModel> delta,
    size_t chunk_bytes = tensor::kDefaultChunkBytes);
// `first` is the PutModelRequest that opens the stream: its meta, and the uploading peer's id and
// session token (empty when the coordinator restores a checkpoint).
absl::StatusOr<aggregator::v1::PutModelResponse> PutModelZeroCopy(
    grpc::ChannelInterface& channel, grpc::ClientContext& context,
    const aggregator::v1::PutModelRequest& first, std::shared_ptr<const tensor::EncodedModel> model,
    size_t chunk_bytes = tensor::kDefaultChunkBytes);

// Malloc settings for processes that stream large models: keeps ~1 MiB message buffers in the
// heap instead of mmap/munmap (and page-faulting) each one, which otherwise costs more than
// the copy itself. Call once at the start of main().
void TuneAllocatorForModelStreams();

}  // namespace shoal::rpc
