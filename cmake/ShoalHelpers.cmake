# Small helpers that keep every target declared the same way.

# Warnings live in one INTERFACE target, linked PRIVATE by every Shoal target.
add_library(shoal_warnings INTERFACE)
# (CI=true scripts/build fails on any warning without changing the flags.)
target_compile_options(shoal_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)

# Unity batches (SHOAL_UNITY_BUILD) for a library or binary of Shoal's own; a file that cannot
# share a batch (a clash of file-local names) sets SKIP_UNITY_BUILD_INCLUSION.
function(shoal_unity target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${SHOAL_UNITY_BUILD}
    UNITY_BUILD_BATCH_SIZE ${SHOAL_UNITY_BATCH_SIZE})
endfunction()

# -O1 instead of Release's -O3 for code whose own machine code is not where its time goes:
# protoc's generated messages and stubs (serialising and parsing run in libprotobuf and gRPC; a
# TaskSpec's and an EvalReport's round trip measured the same at -O1 and -O3) and the LibTorch
# glue (the tensor work runs in LibTorch). It takes a quarter to a third off those units'
# compile time (docs/performance.md, "The demo"). Not for Shoal's own loops (aggregation,
# masks, compression), which rely on -O2's and -O3's vectoriser.
function(shoal_light_optimisation target)
  target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
endfunction()

# Code that includes LibTorch's headers (compiled with shoal_light_optimisation): the training
# library and the tests and benches that include its LibTorch headers. clang 14 with libstdc++ 12
# cannot compile LibTorch 1.13's headers as C++20 (c10::List holds a std::vector of the
# incomplete c10::IValue, and clang instantiates C++20's constexpr vector members eagerly), so
# under clang (the default compiler) such a target is C++17, with the few C++20 forms clang
# accepts there as extensions (defaulted comparisons, designated initializers). g++ (the
# sanitizer builds) compiles it as C++20 like the rest.
function(shoal_libtorch_code target)
  shoal_light_optimisation(${target})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set_target_properties(${target} PROPERTIES CXX_STANDARD 17)
    target_compile_options(${target} PRIVATE -Wno-c++20-extensions -Wno-c++20-designator)
  endif()
endfunction()

# Precompiled headers (clang): cmake/precompiled.h is compiled once, in shoal_precompiled, and
# every library, binary and generated-code target reuses it instead of parsing the same headers
# again (docs/performance.md, "The build"). The reusing unit's flags must match the header's
# where clang checks them (the language standard, -pthread, NDEBUG, optimisation on or off), so
# each such target compiles with -pthread. Not for:
# - LibTorch targets (shoal_libtorch_code: C++17 under clang); the choice is made at the end of
#   the target's directory, after shoal_libtorch_code may have marked it;
# - tests (shoal_cc_test): ccache finds a test's file-by-file units again (in another clone of
#   the same commit too) from their sources and headers alone; a unit that takes the precompiled
#   header needs the preprocessor first, as the generated header that includes it names the
#   checkout's path;
# - the sanitizer builds (g++) and the fuzz build.
function(shoal_precompiled_headers target)
  if(TARGET shoal_precompiled)
    # (EVAL: a deferred call's arguments are otherwise read when it runs, not now.)
    cmake_language(EVAL CODE
      "cmake_language(DEFER CALL shoal_reuse_precompiled_headers [[${target}]])")
  endif()
endfunction()
function(shoal_reuse_precompiled_headers target)
  get_target_property(standard ${target} CXX_STANDARD)
  if(NOT standard STREQUAL "17")
    target_compile_options(${target} PRIVATE -pthread)
    target_precompile_headers(${target} REUSE_FROM shoal_precompiled)
  endif()
endfunction()

# shoal_cc_library(NAME <name> SRCS ... [DEPS ...] [PRIVATE_DEPS ...])
# Declares shoal_<name> with alias shoal::<name>.
function(shoal_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target shoal_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SRCS})
  add_library(shoal::${ARG_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE shoal_warnings ${ARG_PRIVATE_DEPS})
  shoal_unity(${target})
  shoal_precompiled_headers(${target})
endfunction()

# shoal_cc_binary(NAME <binary name> SRCS ... DEPS ...)
function(shoal_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE shoal_warnings ${ARG_DEPS})
  shoal_unity(${ARG_NAME})
  shoal_precompiled_headers(${ARG_NAME})
endfunction()

# shoal_cc_test(NAME <name> SRCS ... DEPS ... [LABELS ...] [TIMEOUT s])
# One gtest binary registered as one ctest test (tests inside run in one process).
function(shoal_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE shoal_warnings ${ARG_DEPS} shoal::test_support
    GTest::gmock GTest::gtest_main)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(time_scale 1)
  if(SHOAL_TEST_TIMEOUT_SCALE)  # set by cmake/ShoalSanitizers.cmake
    set(time_scale ${SHOAL_TEST_TIMEOUT_SCALE})
  endif()
  # The test's own deadlines scale as its timeout does (tests/testing/wait.h: Scaled).
  math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * ${time_scale}")
  # Cluster tests take one at a time (RESOURCE_LOCK cluster) and are the suite's longest chain:
  # a high COST makes ctest start them first, not after the unit and service tests, so that the
  # other slot runs those meanwhile (ctest's own timings only exist after a first run).
  if("cluster" IN_LIST ARG_LABELS)
    set_tests_properties(${ARG_NAME} PROPERTIES COST 100)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    ENVIRONMENT "SHOAL_BIN_DIR=${PROJECT_BINARY_DIR}/bin;SHOAL_SOURCE_DIR=${PROJECT_SOURCE_DIR};SHOAL_TEST_MODELS=${PROJECT_BINARY_DIR}/tests/models;SHOAL_TEST_TIME_SCALE=${time_scale}")
endfunction()

# shoal_proto_library(NAME <name> PROTOS ... [DEPS ...] [GRPC])
# Generates C++ messages into the build tree as shoal::<name>_proto and, with GRPC, the service
# stubs and bases as shoal::<name>_grpc (which links gRPC; the messages target does not).
function(shoal_proto_library)
  cmake_parse_arguments(ARG "GRPC" "NAME" "PROTOS;DEPS" ${ARGN})
  set(proto_root ${PROJECT_SOURCE_DIR}/protos)
  set(out_root ${PROJECT_BINARY_DIR}/gen)
  set(message_srcs)
  set(grpc_srcs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${proto_root} ${abs})
    string(REGEX REPLACE "\\.proto$" "" stem ${rel})
    set(outs ${out_root}/${stem}.pb.cc ${out_root}/${stem}.pb.h)
    set(args --cpp_out=${out_root})
    if(ARG_GRPC)
      list(APPEND outs ${out_root}/${stem}.grpc.pb.cc ${out_root}/${stem}.grpc.pb.h)
      list(APPEND args --grpc_out=${out_root}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>)
      list(APPEND grpc_srcs ${out_root}/${stem}.grpc.pb.cc ${out_root}/${stem}.grpc.pb.h)
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_root}
      COMMAND protobuf::protoc -I${proto_root} ${args} ${abs}
      DEPENDS ${abs} protobuf::protoc
      COMMENT "protoc ${rel}"
      VERBATIM)
    list(APPEND message_srcs ${out_root}/${stem}.pb.cc ${out_root}/${stem}.pb.h)
  endforeach()
  # Messages only: what domain code links (no gRPC).
  set(target shoal_${ARG_NAME}_proto)
  add_library(${target} STATIC ${message_srcs})
  add_library(shoal::${ARG_NAME}_proto ALIAS ${target})
  # SYSTEM: warnings in generated headers (clang's -Woverloaded-virtual on gRPC's raw-method
  # bases) are protoc's, not Shoal's.
  target_include_directories(${target} SYSTEM PUBLIC ${out_root})
  # Not the messages in unity batches: each .pb.cc has file-local tables of the same names.
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf ${ARG_DEPS})
  shoal_light_optimisation(${target})
  shoal_precompiled_headers(${target})
  if(ARG_GRPC)
    # The service stubs and bases: only the gRPC adapters and clients link these.
    set(grpc_target shoal_${ARG_NAME}_grpc)
    add_library(${grpc_target} STATIC ${grpc_srcs})
    add_library(shoal::${ARG_NAME}_grpc ALIAS ${grpc_target})
    target_link_libraries(${grpc_target} PUBLIC ${target} gRPC::grpc++)
    shoal_unity(${grpc_target})
    shoal_light_optimisation(${grpc_target})
    shoal_precompiled_headers(${grpc_target})
  endif()
endfunction()
