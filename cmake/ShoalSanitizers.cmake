# SHOAL_SANITIZE=address|thread builds every Shoal target (services, libraries, tests) with a
# sanitizer; scripts/test --asan / --tsan configure their own build directories with it.
#
#   address  AddressSanitizer (with LeakSanitizer) + UndefinedBehaviorSanitizer; a UB report
#            aborts the test (-fno-sanitize-recover), as an ASan report does.
#   thread   ThreadSanitizer.
#
# Only Shoal's own code is instrumented: LibTorch, gRPC, protobuf and Abseil come from Debian
# as they are. What that means for each sanitizer is in tests/sanitizers/*.supp.
set(SHOAL_SANITIZE "" CACHE STRING "Sanitizer for every target: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE SHOAL_SANITIZE PROPERTY STRINGS "" address thread)

# shoal_not_under_tsan(TEST ...): disables tests that cannot run in a ThreadSanitizer build.
# protobuf's MapField gets two extra members under TSan (google/protobuf/map_field.h), so a
# message with a map that is compiled into Debian's libprotobuf (google.protobuf.Struct, what
# JSON parses into) has another layout there than its inline accessors expect in Shoal's TSan
# code: they read the wrong offsets and crash. Shoal's own messages are compiled with Shoal's
# flags and are not affected.
function(shoal_not_under_tsan)
  if(SHOAL_SANITIZE STREQUAL "thread")
    set_tests_properties(${ARGN} PROPERTIES DISABLED TRUE)
  endif()
endfunction()

if(SHOAL_SANITIZE STREQUAL "")
  return()
elseif(SHOAL_SANITIZE STREQUAL "address")
  set(_shoal_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined)
elseif(SHOAL_SANITIZE STREQUAL "thread")
  set(_shoal_sanitize_flags -fsanitize=thread)
else()
  message(FATAL_ERROR "SHOAL_SANITIZE must be address, thread or empty (got '${SHOAL_SANITIZE}')")
endif()

# Line tables (-g1) are enough for symbolized reports and keep the build fast.
add_compile_options(${_shoal_sanitize_flags} -fno-omit-frame-pointer -g1)
add_link_options(${_shoal_sanitize_flags})
# Sanitized code runs several times slower: every test's ctest TIMEOUT is multiplied by this.
set(SHOAL_TEST_TIMEOUT_SCALE 3)
list(JOIN _shoal_sanitize_flags " " _shoal_flags_text)
message(STATUS "Shoal: sanitizer ${SHOAL_SANITIZE} (${_shoal_flags_text})")
