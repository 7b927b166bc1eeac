#pragma once

// How a peer compresses its updates, for the modes that send updates: the federated modes (to
// an aggregator) and decentralized (to the other participants). See docs/how-to/compression.md.

#include <string>

#include "libs/tensor/compression.h"
#include "shoal/common/v1/task.pb.h"

namespace shoal::peer {

// The compression settings of `spec` (TaskSpec.compression, topk_ratio, topk_values, ...).
tensor::CompressionSettings CompressionOf(const common::v1::TaskSpec& spec);

// One line for the log that says how `compressor` encodes updates ("" for none), e.g. "top-k
// 0.01 of the tensors of at least 4096 values, of each, values ENCODING_INT8".
std::string DescribeCompression(const tensor::Compressor& compressor);

}  // namespace shoal::peer
