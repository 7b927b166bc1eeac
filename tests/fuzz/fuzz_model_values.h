#pragma once

// What the aggregator fuzz targets share: a small model layout and values drawn from the input.

#include <fuzzer/FuzzedDataProvider.h>

#include "libs/tensor/flat_model.h"

namespace shoal::fuzz {

// 9 floats: "w" {2, 3} and "b" {3}.
inline const tensor::ModelLayout& SmallLayout() {
  static const tensor::ModelLayout* layout =
      new tensor::ModelLayout(*tensor::ModelLayout::Create({{"w", {2, 3}}, {"b", {3}}}));
  return *layout;
}

// 0, a small integer, any float (huge, NaN or Inf included) or one in [-1, 1].
inline float FuzzedValue(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      return 0.0f;
    case 1:
      return static_cast<float>(in.ConsumeIntegralInRange(-4, 4));
    case 2:
      return in.ConsumeFloatingPoint<float>();
    default:
      return in.ConsumeFloatingPointInRange<float>(-1.0f, 1.0f);
  }
}

}  // namespace shoal::fuzz
