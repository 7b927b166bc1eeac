#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shoal::tensor {

// What a tensor's elements are. Models and updates are float32. A kUint32 tensor holds values of
// the ring Z_(2^32) (a masked update of secure aggregation in a decentralized round): FlatModel
// keeps their bits in its float storage, copied with memcpy and never computed on as floats, and
// they travel as DTYPE_UINT32, unchecked for finiteness. Model files hold float32 tensors only.
enum class Element : uint8_t { kFloat32, kUint32 };

// One named tensor of a model, 4 bytes an element.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Element element = Element::kFloat32;

  int64_t NumElements() const;
  bool operator==(const TensorSpec& other) const = default;
};

// The ordered list of a model's tensors and where each lives in one contiguous float buffer.
// Immutable once created; cheap to copy. Thread-compatible.
class ModelLayout {
 public:
  ModelLayout() = default;
  // Errors: INVALID_ARGUMENT on an empty or duplicate name, or a negative dimension.
  static absl::StatusOr<ModelLayout> Create(std::vector<TensorSpec> tensors);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  size_t num_tensors() const { return tensors_.size(); }
  // Element offset of tensor `i` in the flat buffer.
  size_t offset(size_t i) const { return offsets_[i]; }
  size_t total_elements() const { return total_elements_; }
  size_t total_bytes() const { return total_elements_ * sizeof(float); }
  bool operator==(const ModelLayout& other) const { return tensors_ == other.tensors_; }
  // "conv1.weight[16,1,5,5], conv1.bias[16], ..." for error messages ("masked_update[203]
  // uint32" for a kUint32 tensor).
  std::string DebugString() const;
  // "tensor 'conv1.weight' element 7" for flat index `index` (names escaped: they may come
  // from the network); "element N" past the end.
  std::string DescribeElement(size_t index) const;

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<size_t> offsets_;
  size_t total_elements_ = 0;
};

// A model's parameters (or a delta) in one contiguous float32 buffer laid out by `layout`.
// A value type; share immutable snapshots as std::shared_ptr<const FlatModel>.
struct FlatModel {
  ModelLayout layout;
  std::vector<float> values;  // layout.total_elements() floats

  // XXH3-64 over the little-endian bytes of `values` (the tensors' payloads in order).
  uint64_t Digest() const;
};

// Values [first, first + values.size()) of a model, handed on as they arrive (e.g. from a
// download) to wherever the model is going: a file, the parameters.
using WriteValues = std::function<absl::Status(size_t first, absl::Span<const float> values)>;
// Reads values [first, first + out.size()) of a model held elsewhere (e.g. a file) into `out`.
using ReadValues = std::function<absl::Status(size_t first, absl::Span<float> out)>;

// XXH3-64 of a byte range; the digest used in TensorHeader.digest_xxh3.
uint64_t DigestBytes(const void* data, size_t size);

}  // namespace shoal::tensor
