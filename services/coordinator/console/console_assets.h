#pragma once

#include <cstddef>

namespace shoal::coordinator::console {

// A file of services/coordinator/console/assets, embedded at build time (embed_assets.cmake
// writes console_assets.cc).
struct Asset {
  const char* path;          // URL path, e.g. "/console.js"
  const char* content_type;  // from the file's extension
  const unsigned char* data;
  size_t size;
};

// Every asset; "/index.html" is also served as "/".
const Asset* ConsoleAssets(size_t* count);

}  // namespace shoal::coordinator::console
