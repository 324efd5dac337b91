# lt_test_precompiled_headers(TARGET): GoogleTest, nlohmann::json and the standard headers the test
# files include, compiled once per test binary into a precompiled header instead of in every test
# file. It pays where parsing dominates, in the sanitizer build at -O0 (llamatrain_tests 373 -> 155
# CPU s together with the unity core), and hardly at -O3 (279 -> 273 CPU s); the simulator's test
# binaries use lt_sim_test_precompiled_headers (below). docs/building.md, "Where a CI run's time goes".
function(lt_test_precompiled_headers target)
  # And four test files to a translation unit (CMake's unity build): each file's instantiations of
  # gtest's and json's templates are then compiled once per four files. llamatrain_tests: 149 ->
  # 103 CPU s at -O1. A name a test file defines at namespace scope must then be unique among its
  # neighbours (the compiler says when it is not), and `testing::` inside namespace lt is
  # lt::testing (tests/test_util.h): gtest's is ::testing.
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  target_precompile_headers(${target} PRIVATE
    <gtest/gtest.h> <nlohmann/json.hpp>
    <algorithm> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional> <map> <memory> <sstream>
    <string> <vector>)
endfunction()

# lt_sim_test_precompiled_headers(TARGET [NOT_FOR source...]): GoogleTest and the standard headers
# of the kernel simulator's test files (tests/sim), compiled once per test binary; no unity build
# (each test file has its own Shape, kShapes and kPad). The sources after NOT_FOR (the kernels'
# wrappers and the simulator that llamatrain_sim_tests_asan compiles itself) need neither header
# and do without it: applied to them too it cost more than it saved (141 -> 162 CPU s). A test file
# at -O1 with ASan: 4.6 -> 2.9 s, against 4.3 s for the header, once.
function(lt_sim_test_precompiled_headers target)
  cmake_parse_arguments(P "" "" "NOT_FOR" ${ARGN})
  target_precompile_headers(${target} PRIVATE
    <gtest/gtest.h> <algorithm> <cmath> <cstdio> <cstring> <random> <string> <vector>)
  if(P_NOT_FOR)
    set_source_files_properties(${P_NOT_FOR} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# lt_test_code_options(TARGET): how a test binary's own sources are compiled, which is not how the
# code under test is.
# * In an optimised build, -O1 (after the build type's -O3, so it wins). The code under test lives
#   in llamatrain_core and the kernel libraries, which keep -O3; the test files are mostly gtest
#   assertions, json and command lines, where -O3 buys nothing at run time and costs 40% more
#   compile time (test_cli_options.cpp: 23.1 s at -O3, 13.8 s at -O1).
# * In the sanitizer build (-O0), AddressSanitizer without UBSan: UBSan's checks of every pointer
#   and reference (null, alignment) and of every arithmetic step of gtest's and json's templates
#   took 40% of each test file's compile time (test_cli_options.cpp 16.7 -> 10.2 s) and look at
#   test code. The code under test keeps both: llamatrain (which the CLI and fault tests run) is
#   wholly instrumented, and so is every function of llamatrain_core; what a test binary loses is
#   UBSan in the inline and template functions that a test file instantiates too (the linker keeps
#   the test file's copy, the first on the link line).
function(lt_test_code_options target)
  if(LLAMATRAIN_SANITIZE)
    target_compile_options(${target} PRIVATE -fno-sanitize=undefined)
  elseif(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
    target_compile_options(${target} PRIVATE -O1)
  endif()
endfunction()
