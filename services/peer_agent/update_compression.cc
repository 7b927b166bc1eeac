#include "services/peer_agent/update_compression.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/task/task_federated.h"

namespace shoal::peer {

tensor::CompressionSettings CompressionOf(const common::v1::TaskSpec& spec) {
  const auto encoding = [](common::v1::Compression c) {
    switch (c) {
      case common::v1::COMPRESSION_FP16:
        return common::v1::ENCODING_FP16;
      case common::v1::COMPRESSION_INT8:
        return common::v1::ENCODING_INT8;
      case common::v1::COMPRESSION_TOPK:
        return common::v1::ENCODING_SPARSE;
      default:
        return common::v1::ENCODING_RAW;
    }
  };
  tensor::CompressionSettings settings;
  settings.codec = encoding(spec.compression());
  if (spec.has_topk_ratio()) settings.topk_ratio = spec.topk_ratio();
  settings.topk_values = encoding(spec.topk_values());
  settings.topk_warmup_rounds = spec.topk_warmup_rounds();
  // Unset (a spec made over the API rather than from a task file): the documented default.
  settings.topk_min_elements =
      spec.has_topk_min_elements() ? spec.topk_min_elements() : task::kDefaultTopKMinElements;
  settings.topk_split = spec.topk_split() == common::v1::TOPK_SPLIT_EQUAL
                            ? tensor::TopKSplit::kEqual
                            : tensor::TopKSplit::kPerTensor;
  if (settings.topk_values == common::v1::ENCODING_SPARSE) {
    settings.topk_values = common::v1::ENCODING_RAW;  // refused by task validation
  }
  return settings;
}

std::string DescribeCompression(const tensor::Compressor& compressor) {
  const tensor::CompressionSettings& c = compressor.settings();
  if (c.codec == common::v1::ENCODING_RAW) return "";
  if (c.codec != common::v1::ENCODING_SPARSE) return common::v1::Encoding_Name(c.codec);
  std::string warmup;
  for (uint32_t v = 0; v < c.topk_warmup_rounds; ++v) {
    absl::StrAppend(&warmup, v == 0 ? " (warm-up: " : ", ",
                    absl::StrFormat("%g", compressor.TopKRatio(v)), " from version ", v);
  }
  if (!warmup.empty()) warmup += ")";
  return absl::StrFormat("top-k %g of the tensors of at least %u values, %s%s, values %s",
                         c.topk_ratio, c.topk_min_elements,
                         c.topk_split == tensor::TopKSplit::kEqual ? "split equally" : "of each",
                         warmup, common::v1::Encoding_Name(c.topk_values));
}

}  // namespace shoal::peer
