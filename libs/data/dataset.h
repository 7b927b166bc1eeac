#pragma once

// Torch-free data sets that a peer loads from its own files (tabular CSV, image folders). The
// loaders in this directory return a Dataset; libs/training turns one into tensors.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shoal::data {

// A labelled data set in memory: `count` samples, each `sample_shape` float32 values (row-major,
// samples one after the other), and a class label per sample. A value type.
struct Dataset {
  std::vector<int64_t> sample_shape;       // {features} for tables, {channels, height, width}
  size_t count = 0;                        // samples
  std::vector<float> values;               // count * SampleSize()
  std::vector<uint32_t> labels;            // count, each < class_names.size()
  std::vector<std::string> class_names;    // label i names class class_names[i]
  std::vector<std::string> feature_names;  // tables: the feature columns in order; else empty

  // Values per sample: the product of sample_shape (1 for an empty shape).
  size_t SampleSize() const {
    size_t n = 1;
    for (int64_t d : sample_shape) n *= static_cast<size_t>(d);
    return n;
  }

  // The features that normalisation scales alike, each ValuesPerFeature() consecutive values of
  // a sample: a table's columns (one value each), or an image's channels (sample_shape
  // {channels, height, width}, planar: the height x width pixels of one channel, then the next).
  size_t FeatureCount() const {
    return IsImage() ? static_cast<size_t>(sample_shape[0]) : SampleSize();
  }
  size_t ValuesPerFeature() const {
    return IsImage() ? static_cast<size_t>(sample_shape[1]) * static_cast<size_t>(sample_shape[2])
                     : 1;
  }
  bool IsImage() const { return sample_shape.size() == 3; }
};

}  // namespace shoal::data
