// The headers most of Shoal's units include, precompiled once and taken by every library, binary
// and generated-code target that clang compiles as C++20 (cmake/ShoalHelpers.cmake:
// shoal_precompiled_headers). Only the standard library, Abseil, protobuf and gRPC: installed
// wherever Shoal builds. A unit sees them whether it includes them or not, so each source still
// includes what it uses (the g++ builds and -DSHOAL_PRECOMPILED_HEADERS=OFF do not hide a
// missing include), and which library may use gRPC is still decided by its own includes and links.
#include <algorithm>
#include <any>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/generated_message_reflection.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_field.h"
#include "grpcpp/grpcpp.h"
