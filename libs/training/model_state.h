#pragma once

// A model's state as Shoal moves it: the parameters, flattened in registration order, then
// (in a state layout) the float buffers named "buffer:<name>". Internal to libs/training: the
// trainer and WriteTorchScript share these.

#include <torch/torch.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/tensor/flat_model.h"
#include "libs/training/models.h"

namespace shoal::training {

// INTERNAL naming `what`, with the first line of a LibTorch exception's message (c10::Error
// messages carry a long backtrace after it).
absl::Status TorchError(const std::string& what, const std::exception& e);

// The parameters' layout, and the state layout (parameters, then float buffers).
absl::StatusOr<tensor::ModelLayout> LayoutOf(Model& model);
absl::StatusOr<tensor::ModelLayout> StateLayoutOf(Model& model);

// The float buffers of `model` (integer ones such as num_batches_tracked are not exchanged).
std::vector<std::pair<std::string, torch::Tensor>> FloatBuffers(Model& model);

// The parameters, and the float buffers when `layout` is a state layout (StateLayoutOf), in host
// memory; from a GPU in one copy. Written into `buffer`'s storage (its contents overwritten):
// pass a recycled model-sized buffer (tensor::BufferPool) to skip the first touch of fresh pages.
absl::StatusOr<tensor::FlatModel> FlattenState(Model& model, const tensor::ModelLayout& layout,
                                               const tensor::ModelLayout& params_layout,
                                               std::vector<float> buffer = {});

// The reverse: sets the parameters, and the float buffers when `layout` is a state layout, from
// `read` (values in `layout` order). On the CPU each tensor is read straight into its memory, so
// loading a model from a file takes no model-sized buffer; for a GPU the state is read into host
// memory and copied to the device once. The caller has checked `layout`. An error from `read`
// leaves the model partly loaded.
absl::Status LoadState(Model& model, const tensor::ModelLayout& layout,
                       const tensor::ModelLayout& params_layout, const tensor::ReadValues& read);

// A ReadValues over values in memory.
tensor::ReadValues ReadFromMemory(const std::vector<float>& values);

}  // namespace shoal::training
