// The client helpers of libs/rpc/model_stream against in-memory stream fakes; the server
// reactor is covered by the aggregator service test over real gRPC.
#include <grpcpp/impl/codegen/proto_utils.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/model_stream.h"

namespace shoal::rpc {
namespace {

using common::v1::ModelChunk;
using ::testing::HasSubstr;

class FakeReader : public grpc::ClientReaderInterface<ModelChunk> {
 public:
  FakeReader(std::deque<ModelChunk> chunks, grpc::Status status)
      : chunks_(std::move(chunks)), status_(std::move(status)) {}
  void WaitForInitialMetadata() override {}
  bool NextMessageSize(uint32_t* sz) override {
    if (chunks_.empty()) return false;
    *sz = static_cast<uint32_t>(chunks_.front().ByteSizeLong());
    return true;
  }
  bool Read(ModelChunk* msg) override {
    if (chunks_.empty()) return false;
    *msg = std::move(chunks_.front());
    chunks_.pop_front();
    return true;
  }
  grpc::Status Finish() override {
    finished_ = true;
    return status_;
  }
  bool finished() const { return finished_; }
  size_t left() const { return chunks_.size(); }

 private:
  std::deque<ModelChunk> chunks_;
  grpc::Status status_;
  bool finished_ = false;
};

template <typename Request>
class FakeWriter : public grpc::ClientWriterInterface<Request> {
 public:
  explicit FakeWriter(size_t fail_after = SIZE_MAX) : fail_after_(fail_after) {}
  bool Write(const Request& msg, grpc::WriteOptions) override {
    if (written.size() >= fail_after_) return false;
    written.push_back(msg);
    return true;
  }
  bool WritesDone() override {
    writes_done = true;
    return true;
  }
  grpc::Status Finish() override { return status; }

  std::vector<Request> written;
  bool writes_done = false;
  grpc::Status status = grpc::Status::OK;

 private:
  size_t fail_after_;
};

tensor::FlatModel Model() {
  tensor::FlatModel m;
  m.layout = *tensor::ModelLayout::Create({{"w", {300, 1000}}, {"b", {7}}});
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = static_cast<float>(i % 97) * 0.01f;
  return m;
}

std::deque<ModelChunk> Stream(const tensor::FlatModel& m) {
  std::deque<ModelChunk> out;
  ModelChunk c;
  *c.mutable_meta() = tensor::MakeModelMeta("task", 4, m);
  out.push_back(c);
  tensor::FrameEncoder enc(m);
  while (enc.Next(c.mutable_frame())) out.push_back(c);
  return out;
}

TEST(ModelStreamTest, ReadRoundTrip) {
  tensor::FlatModel m = Model();
  FakeReader reader(Stream(m), grpc::Status::OK);
  auto got = ReadModelStream(reader, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.task(), "task");
  EXPECT_EQ(got->meta.version(), 4u);
  EXPECT_EQ(got->model.values, m.values);
  EXPECT_EQ(got->model.layout, m.layout);
  EXPECT_TRUE(reader.finished());
}

TEST(ModelStreamTest, ServerErrorIsReturned) {
  FakeReader reader({}, grpc::Status(grpc::StatusCode::NOT_FOUND, "no task 'x'"));
  auto got = ReadModelStream(reader, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("no task"));
}

TEST(ModelStreamTest, TruncatedStreamIsInvalid) {
  tensor::FlatModel m = Model();
  auto chunks = Stream(m);
  chunks.pop_back();
  FakeReader reader(std::move(chunks), grpc::Status::OK);
  auto got = ReadModelStream(reader, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("'b'"));
}

TEST(ModelStreamTest, MissingMetaAndCorruptionAreInvalidAndDrained) {
  tensor::FlatModel m = Model();
  auto chunks = Stream(m);
  chunks.pop_front();
  FakeReader no_meta(chunks, grpc::Status::OK);
  EXPECT_THAT(ReadModelStream(no_meta, {}).status().message(), HasSubstr("ModelMeta"));
  EXPECT_EQ(no_meta.left(), 0u);
  EXPECT_TRUE(no_meta.finished());

  auto corrupt = Stream(m);
  (*corrupt[2].mutable_frame()->mutable_chunk())[10] ^= 1;
  FakeReader reader(std::move(corrupt), grpc::Status::OK);
  auto got = ReadModelStream(reader, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("digest"));
  EXPECT_EQ(reader.left(), 0u);
}

TEST(ModelStreamTest, LimitsApply) {
  tensor::FlatModel m = Model();
  FakeReader reader(Stream(m), grpc::Status::OK);
  tensor::DecoderLimits limits;
  limits.max_total_bytes = 1000;
  EXPECT_THAT(ReadModelStream(reader, limits).status().message(), HasSubstr("limit"));
}

TEST(ModelStreamTest, WritePushUpdateSendsMetaThenFrames) {
  tensor::FlatModel m = Model();
  FakeWriter<aggregator::v1::PushUpdateRequest> writer;
  aggregator::v1::UpdateMeta meta;
  meta.set_task("task");
  meta.set_peer_id("p1");
  ASSERT_TRUE(WritePushUpdate(writer, meta, m).ok());
  ASSERT_GE(writer.written.size(), 3u);
  EXPECT_TRUE(writer.written[0].has_meta());
  EXPECT_EQ(writer.written[0].meta().peer_id(), "p1");
  EXPECT_TRUE(writer.writes_done);
  tensor::FrameDecoder d = tensor::FrameDecoder::ForLayout(m.layout, true);
  for (size_t i = 1; i < writer.written.size(); ++i) {
    ASSERT_TRUE(writer.written[i].has_frame());
    ASSERT_TRUE(d.Add(writer.written[i].frame()).ok());
  }
  auto got = std::move(d).Finish();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->values, m.values);
}

TEST(ModelStreamTest, WriterReturnsTheServersErrorWhenTheStreamBreaks) {
  tensor::FlatModel m = Model();
  FakeWriter<aggregator::v1::PutModelRequest> writer(/*fail_after=*/2);
  writer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tensor 'w': bad");
  absl::Status s = WritePutModel(writer, tensor::MakeModelMeta("task", 0, m), m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_FALSE(writer.writes_done);
}

grpc::ByteBuffer Serialized(const google::protobuf::MessageLite& m) {
  std::string bytes = m.SerializeAsString();
  // Split into several slices to exercise the multi-slice parsing.
  std::vector<grpc::Slice> slices;
  for (size_t pos = 0; pos < bytes.size(); pos += 7) {
    slices.emplace_back(bytes.data() + pos, std::min<size_t>(7, bytes.size() - pos));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(ModelStreamTest, ParseChunkMessageFindsTheChunkBytes) {
  for (size_t n : {0, 1, 127, 128, 300, 70000}) {
    aggregator::v1::PushUpdateRequest request;
    std::string payload(n, '\0');
    for (size_t i = 0; i < n; ++i) payload[i] = static_cast<char>(i * 31);
    request.mutable_frame()->set_chunk(payload);
    std::vector<grpc::Slice> slices;
    std::vector<absl::string_view> parts;
    ASSERT_TRUE(ParseChunkMessage(Serialized(request), &slices, &parts)) << n;
    std::string joined;
    for (auto p : parts) joined.append(p.data(), p.size());
    EXPECT_EQ(joined, payload);
  }
}

TEST(ModelStreamTest, ParseChunkMessageLeavesOtherMessagesToProtobuf) {
  aggregator::v1::PushUpdateRequest meta;
  meta.mutable_meta()->set_task("t");
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> parts;
  EXPECT_FALSE(ParseChunkMessage(Serialized(meta), &slices, &parts));
  aggregator::v1::PushUpdateRequest header;
  header.mutable_frame()->mutable_header()->set_name("w");
  EXPECT_FALSE(ParseChunkMessage(Serialized(header), &slices, &parts));
  // Trailing bytes after the frame (e.g. a second field) are not the fast shape.
  aggregator::v1::PushUpdateRequest chunk;
  chunk.mutable_frame()->set_chunk("abcd");
  std::string bytes = chunk.SerializeAsString() + std::string("\x0a\x00", 2);
  grpc::Slice slice(bytes.data(), bytes.size());
  EXPECT_FALSE(ParseChunkMessage(grpc::ByteBuffer(&slice, 1), &slices, &parts));
  EXPECT_FALSE(ParseChunkMessage(grpc::ByteBuffer(), &slices, &parts));
}

class RawFakeReader : public grpc::ClientReaderInterface<grpc::ByteBuffer> {
 public:
  explicit RawFakeReader(std::deque<grpc::ByteBuffer> messages) : messages_(std::move(messages)) {}
  void WaitForInitialMetadata() override {}
  bool NextMessageSize(uint32_t* sz) override {
    if (messages_.empty()) return false;
    *sz = static_cast<uint32_t>(messages_.front().Length());
    return true;
  }
  bool Read(grpc::ByteBuffer* msg) override {
    if (messages_.empty()) return false;
    *msg = std::move(messages_.front());
    messages_.pop_front();
    return true;
  }
  grpc::Status Finish() override { return grpc::Status::OK; }

 private:
  std::deque<grpc::ByteBuffer> messages_;
};

// What RawModelWriteReactor sends: the raw reader decodes it from the slices, and protobuf
// parses the same bytes as ModelChunk messages (a typed client reads a raw server).
TEST(ModelStreamTest, ZeroCopyFramesReadBackRawAndAsProtobuf) {
  tensor::FlatModel m;
  m.layout = *tensor::ModelLayout::Create({{"big", {1500, 1000}}, {"empty", {0}}, {"b", {7}}});
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = static_cast<float>(i % 89) * 0.5f;
  auto model = std::make_shared<const tensor::FlatModel>(m);
  ModelChunk first;
  *first.mutable_meta() = tensor::MakeModelMeta("task", 9, m);
  std::deque<grpc::ByteBuffer> raw = {Serialized(first)};
  std::deque<ModelChunk> parsed = {first};
  {
    ZeroCopyFrames frames(tensor::EncodeRaw(model), /*chunk_bytes=*/256 << 10);
    grpc::ByteBuffer message;
    while (frames.Next(&message)) {
      raw.push_back(message);
      grpc::ByteBuffer copy = message;
      ModelChunk chunk;
      const grpc::Status s =
          grpc::GenericDeserialize<grpc::ProtoBufferReader, ModelChunk>(&copy, &chunk);
      ASSERT_TRUE(s.ok()) << s.error_message();
      parsed.push_back(chunk);
    }
  }
  // meta + 3 headers + 23 chunks of the 6 MB tensor (256 KiB each) + 1 chunk of "b".
  EXPECT_EQ(raw.size(), 1u + 3u + 23u + 1u);
  model.reset();  // the messages keep the model's memory alive
  RawFakeReader raw_reader(std::move(raw));
  auto got = ReadModelStream(raw_reader, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.version(), 9u);
  EXPECT_EQ(got->model.layout, m.layout);
  EXPECT_EQ(got->model.values, m.values);
  FakeReader typed(std::move(parsed), grpc::Status::OK);
  auto again = ReadModelStream(typed, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model.values, m.values);
}

// A checkpoint served from its mapped file (ControlService.GetModel) reads back like the model.
TEST(ModelStreamTest, ZeroCopyFramesOfAMappedModelFileReadBack) {
  tensor::FlatModel m;
  m.layout = *tensor::ModelLayout::Create({{"w", {700, 1000}}, {"empty", {0}}, {"b", {3}}});
  m.values.resize(m.layout.total_elements());
  for (size_t i = 0; i < m.values.size(); ++i) m.values[i] = static_cast<float>(i % 97) - 3.5f;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("shoal_mapped_frames_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  ASSERT_TRUE(tensor::WriteModelFile(path, m).ok());
  auto file = tensor::MappedModelFile::Open(path);
  std::filesystem::remove(path);  // the mapping stays valid
  ASSERT_TRUE(file.ok()) << file.status();
  ModelChunk first;
  *first.mutable_meta() = tensor::MakeModelMeta("task", 4, (*file)->layout());
  std::deque<grpc::ByteBuffer> raw = {Serialized(first)};
  {
    ZeroCopyFrames frames(tensor::EncodeRaw(*std::move(file)), /*chunk_bytes=*/1 << 20);
    grpc::ByteBuffer message;
    while (frames.Next(&message)) raw.push_back(message);
  }
  // meta + 3 headers + 3 chunks of the 2.8 MB tensor + 1 chunk of "b"; the messages alone keep
  // the mapping.
  EXPECT_EQ(raw.size(), 1u + 3u + 3u + 1u);
  RawFakeReader reader(std::move(raw));
  auto got = ReadModelStream(reader, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.version(), 4u);
  EXPECT_EQ(got->model.layout, m.layout);
  EXPECT_EQ(got->model.values, m.values);
}

}  // namespace
}  // namespace shoal::rpc
