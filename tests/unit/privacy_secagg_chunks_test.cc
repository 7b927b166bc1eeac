// SecAggServer::AddMaskedChunk: a masked input folded into the sum a chunk at a time, as the
// aggregator takes a peer's masked update message by message. The sum is bit for bit the one of
// whole inputs (AddMaskedInput), and an input that never completes (its sender left, a chunk was
// refused, masking closed first) comes back out of it exactly.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/secagg_federation.h"

namespace shoal::privacy::secagg {
namespace {

using fixture::Config;
using fixture::Drop;
using fixture::Federation;
using fixture::Id;
using ::testing::HasSubstr;

// `values` cut into chunks of `values_per_chunk` ring values (4 bytes each; the last shorter).
std::vector<std::string> Chunks(const std::string& values, size_t values_per_chunk) {
  std::vector<std::string> chunks;
  for (size_t at = 0; at < values.size(); at += 4 * values_per_chunk) {
    chunks.push_back(values.substr(at, 4 * values_per_chunk));
  }
  return chunks;
}

// Folds `chunks` of `id`'s input; true once the last one completed it.
bool FoldAll(SecAggServer& server, const std::string& id, const std::vector<std::string>& chunks) {
  bool whole = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::StatusOr<bool> done = server.AddMaskedChunk(id, chunks[i]);
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) return false;
    EXPECT_EQ(*done, i + 1 == chunks.size()) << id << " chunk " << i;
    whole = *done;
  }
  return whole;
}

TEST(SecAggChunksTest, ChunkedInputsSumBitForBitAsWholeOnes) {
  // Two servers take the same messages; one folds each masked input whole (AddMaskedInput), the
  // other in chunks of odd sizes, interleaved between the senders, into a buffer of garbage from
  // an "earlier round". Their sums agree, and are the sum of the inputs.
  const v1::SecAggConfig config = Config(6, 5, 3, 32, 1001);
  Federation fed(config);
  absl::StatusOr<std::unique_ptr<SecAggServer>> chunked =
      SecAggServer::Create(config, fed.verifier(), std::vector<uint32_t>(2000, 0xdeadbeefu));
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  SecAggServer& other = **chunked;
  std::map<std::string, v1::KeyBundle> bundles;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<v1::AdvertisedKeys> keys = fed.client(Id(i)).AdvertiseKeys();
    ASSERT_TRUE(keys.ok()) << keys.status();
    ASSERT_TRUE(fed.server().AddAdvertisedKeys(*keys).ok());
    ASSERT_TRUE(other.AddAdvertisedKeys(*keys).ok());
  }
  auto bundles_a = fed.server().CloseAdvertising();
  auto bundles_b = other.CloseAdvertising();
  ASSERT_TRUE(bundles_a.ok() && bundles_b.ok());
  for (auto& [id, bundle] : *bundles_a) {
    absl::StatusOr<v1::EncryptedShares> shares = fed.client(id).ShareKeys(bundle);
    ASSERT_TRUE(shares.ok()) << shares.status();
    ASSERT_TRUE(fed.server().AddShares(*shares).ok());
    ASSERT_TRUE(other.AddShares(*shares).ok());
  }
  auto relayed = fed.server().CloseSharing();
  ASSERT_TRUE(relayed.ok() && other.CloseSharing().ok());
  std::map<std::string, std::vector<std::string>> chunks;
  size_t per_chunk = 37;
  for (auto& [id, shares] : *relayed) {
    absl::StatusOr<v1::MaskedInput> masked = fed.client(id).MaskInput(shares, fed.input(id));
    ASSERT_TRUE(masked.ok()) << masked.status();
    ASSERT_TRUE(fed.server().AddMaskedInput(*masked).ok());
    chunks[id] = Chunks(masked->values(), per_chunk);
    per_chunk += 90;  // 37, 127, 217, ... values a chunk
  }
  // Round robin: a chunk of each sender in turn, so every input is partly folded at once.
  std::map<std::string, size_t> next;
  for (size_t done = 0; done < chunks.size();) {
    for (auto& [id, list] : chunks) {
      if (next[id] == list.size()) continue;
      absl::StatusOr<bool> whole = other.AddMaskedChunk(id, list[next[id]++]);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_EQ(*whole, next[id] == list.size());
      if (*whole) ++done;
    }
  }
  auto checks_a = fed.server().CloseMasking();
  auto checks_b = other.CloseMasking();
  ASSERT_TRUE(checks_a.ok() && checks_b.ok());
  EXPECT_EQ(fed.server().survivors(), other.survivors());
  for (auto& [id, check] : *checks_a) {
    absl::StatusOr<v1::ConsistencyCheckResponse> signature = fed.client(id).SignSurvivors(check);
    ASSERT_TRUE(signature.ok()) << signature.status();
    ASSERT_TRUE(fed.server().AddSurvivorSignature(*signature).ok());
    ASSERT_TRUE(other.AddSurvivorSignature(*signature).ok());
  }
  auto requests = fed.server().CloseConsistencyCheck();
  ASSERT_TRUE(requests.ok() && other.CloseConsistencyCheck().ok());
  for (auto& [id, request] : *requests) {
    absl::StatusOr<v1::UnmaskResponse> response = fed.client(id).Unmask(request);
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_TRUE(fed.server().AddUnmaskResponse(*response).ok());
    ASSERT_TRUE(other.AddUnmaskResponse(*response).ok());
  }
  absl::StatusOr<std::vector<uint32_t>> whole_sum = fed.server().CloseUnmasking();
  absl::StatusOr<std::vector<uint32_t>> chunked_sum = other.CloseUnmasking();
  ASSERT_TRUE(whole_sum.ok()) << whole_sum.status();
  ASSERT_TRUE(chunked_sum.ok()) << chunked_sum.status();
  EXPECT_EQ(*chunked_sum, *whole_sum);
  EXPECT_EQ(*chunked_sum, fed.ExpectedSum());
}

// peer-1 and peer-4 send part of their masked inputs and never finish (peer-4's stream ends,
// peer-1 is still sending when masking closes); peer-2's third chunk runs past the vector. The
// others' chunks are folded between theirs. The round ends with the exact sum of the others, for
// a ring of 32 bits and one of 20.
TEST(SecAggChunksTest, AnInputThatNeverCompletesComesBackOutOfTheSum) {
  for (int bits : {32, 20}) {
    SCOPED_TRACE(testing::Message() << bits << " bits");
    Federation fed(Config(8, 7, 4, bits, 500), /*input_seed=*/bits);
    for (const std::string& id : {Id(1), Id(2), Id(4)}) fed.DropAt(id, Drop::kBeforeMasking);
    ASSERT_TRUE(fed.Advertise().ok());
    ASSERT_TRUE(fed.Share().ok());
    SecAggServer& server = fed.server();
    std::map<std::string, std::vector<std::string>> partial;
    v1::MaskedInput whole_of_1;
    for (const std::string& id : {Id(1), Id(2), Id(4)}) {
      absl::StatusOr<v1::MaskedInput> masked =
          fed.client(id).MaskInput(fed.relayed().at(id), fed.input(id));
      ASSERT_TRUE(masked.ok()) << masked.status();
      partial[id] = Chunks(masked->values(), 150);  // 4 chunks: 150, 150, 150, 50
      if (id == Id(1)) whole_of_1 = *masked;
    }
    for (int i = 0; i < 2; ++i) {
      for (const std::string& id : {Id(1), Id(2), Id(4)}) {
        absl::StatusOr<bool> whole = server.AddMaskedChunk(id, partial[id][i]);
        ASSERT_TRUE(whole.ok()) << whole.status();
        EXPECT_FALSE(*whole);
      }
    }
    // 150 + 150 + 250 values: past the 500 of the vector; refused, and its first two chunks
    // come out.
    absl::StatusOr<bool> over = server.AddMaskedChunk(Id(2), partial[Id(2)][2] + partial[Id(2)][2]);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(over.status().message(), HasSubstr("peer-2"));
    server.AbandonMaskedInput(Id(4));  // its stream ended
    ASSERT_TRUE(server.AddMaskedChunk(Id(1), partial[Id(1)][2]).ok());
    // The others send whole inputs, in chunks too; a whole input cannot be sent over a partial.
    for (int i : {0, 3, 5, 6, 7}) {
      absl::StatusOr<v1::MaskedInput> masked =
          fed.client(Id(i)).MaskInput(fed.relayed().at(Id(i)), fed.input(Id(i)));
      ASSERT_TRUE(masked.ok()) << masked.status();
      EXPECT_TRUE(FoldAll(server, Id(i), Chunks(masked->values(), 64)));
    }
    EXPECT_THAT(server.AddMaskedInput(whole_of_1).message(), HasSubstr("coming in chunks"));
    // Masking closes with peer-1's input still three quarters in: out of the sum.
    auto checks = server.CloseMasking();
    ASSERT_TRUE(checks.ok()) << checks.status();
    EXPECT_EQ(server.survivors(), fed.ExpectedSurvivors());
    fed.checks() = *std::move(checks);
    ASSERT_TRUE(fed.Check().ok());
    absl::StatusOr<std::vector<uint32_t>> sum = fed.Unmask();
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, fed.ExpectedSum());
  }
}

TEST(SecAggChunksTest, AChunkIsWholeValuesAndNotBeforeMaskingOrTwice) {
  Federation fed(Config(4, 3, 2, 32, 10));
  ASSERT_TRUE(fed.Advertise().ok());
  EXPECT_EQ(fed.server().AddMaskedChunk(Id(0), std::string(8, 'x')).status().code(),
            absl::StatusCode::kFailedPrecondition);  // still sharing
  ASSERT_TRUE(fed.Share().ok());
  SecAggServer& server = fed.server();
  absl::StatusOr<bool> odd = server.AddMaskedChunk(Id(0), std::string(6, 'x'));
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(), HasSubstr("not whole values"));
  absl::StatusOr<bool> whole = server.AddMaskedChunk(Id(0), std::string(40, 'x'));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole);
  EXPECT_EQ(server.AddMaskedChunk(Id(0), std::string(4, 'x')).status().code(),
            absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace shoal::privacy::secagg
