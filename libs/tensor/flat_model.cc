#include "libs/tensor/flat_model.h"

#include <xxhash.h>

#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/escape.h"

namespace shoal::tensor {

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ModelLayout> ModelLayout::Create(std::vector<TensorSpec> tensors) {
  ModelLayout layout;
  std::set<std::string> names;
  size_t total = 0;
  layout.offsets_.reserve(tensors.size());
  for (const TensorSpec& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("tensor with an empty name");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name '", EscapeBytes(t.name), "'"));
    }
    // Bound the element count so sizes in bytes never overflow.
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", EscapeBytes(t.name), "': negative dimension ", d));
      }
      if (d != 0 && n > kMaxElements / static_cast<uint64_t>(d)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", EscapeBytes(t.name), "' is too large"));
      }
      n *= static_cast<uint64_t>(d);
    }
    if (total + n > kMaxElements) {
      return absl::InvalidArgumentError("model is too large");
    }
    layout.offsets_.push_back(total);
    total += n;
  }
  layout.tensors_ = std::move(tensors);
  layout.total_elements_ = total;
  return layout;
}

std::string ModelLayout::DebugString() const {
  return absl::StrJoin(tensors_, ", ", [](std::string* out, const TensorSpec& t) {
    absl::StrAppend(out, t.name, "[", absl::StrJoin(t.shape, ","), "]",
                    t.element == Element::kUint32 ? " uint32" : "");
  });
}

std::string ModelLayout::DescribeElement(size_t index) const {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const size_t n = static_cast<size_t>(tensors_[t].NumElements());
    if (index >= offsets_[t] && index < offsets_[t] + n) {
      return absl::StrCat("tensor '", EscapeBytes(tensors_[t].name), "' element ",
                          index - offsets_[t]);
    }
  }
  return absl::StrCat("element ", index);
}

uint64_t FlatModel::Digest() const {
  return DigestBytes(values.data(), values.size() * sizeof(float));
}

uint64_t DigestBytes(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace shoal::tensor
