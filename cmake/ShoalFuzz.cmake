# SHOAL_FUZZ=ON: every Shoal target gets libFuzzer's coverage instrumentation and ASan + UBSan;
# the fuzz targets in tests/fuzz link libFuzzer's main. Configure a separate build directory
# with CC=clang CXX=clang++ (scripts/fuzz does); the normal GCC build never includes this file.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "SHOAL_FUZZ=ON needs clang (CXX=clang++), not ${CMAKE_CXX_COMPILER_ID}")
endif()
set(SHOAL_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
  -fno-omit-frame-pointer -g)
add_compile_options(-fsanitize=fuzzer-no-link ${SHOAL_SANITIZE_FLAGS})
add_link_options(-fsanitize=address,undefined)
