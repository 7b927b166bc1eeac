#pragma once

// The 2-D scattering transform (Mallat 2012; Bruna and Mallat 2013) as fixed features for a
// model: order 2, J = 2 scales, L = 8 orientations, Morlet wavelets. Tramer and Boneh (ICLR 2021,
// "Differentially Private Learning Needs Better Features (or Much More Data)") train a linear
// model on these features with DP-SGD and come much closer to non-private accuracy than an
// end-to-end CNN. Only libs/training (and its tests) include this header.

#include <torch/torch.h>

namespace shoal::training {

// Channels of the transform per input channel: 1 low-pass + J L first order + L^2 J (J - 1) / 2
// second order = 1 + 16 + 64.
inline constexpr int64_t kScatteringChannels = 81;
// Each sample's channels are normalised in groups of this many (mean 0, variance 1 per group;
// group normalisation without learned parameters, so it costs no privacy).
inline constexpr int64_t kScatteringGroup = 3;

// images [N, C, H, W] (H and W over 10) -> [N, 81 C, ceil(H / 4), ceil(W / 4)] float, each
// sample's channels normalised in groups of kScatteringGroup. The filters are applied as
// convolutions over the maps reflected at their borders by the filters' radius (10 pixels at
// full resolution, 5 at half); the low-pass filter is sampled every 4 pixels of the image.
// Computed in blocks of samples so that the intermediate maps stay small. Throws c10::Error on
// a tensor that is not 4-dimensional or images of 10 x 10 or less.
torch::Tensor ScatteringFeatures(const torch::Tensor& images);

}  // namespace shoal::training
