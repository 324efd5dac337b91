# lt_test_precompiled_headers(TARGET): GoogleTest, nlohmann::json and the standard headers the test
# files include, compiled once per test binary into a precompiled header instead of in every test
# file. It pays where parsing dominates, in the sanitizer build at -O0 (llamatrain_tests 373 -> 155
# CPU s together with the unity core), and hardly at -O3 (279 -> 273 CPU s); the simulator's test
# binaries do not use it: they compile the kernels' wrappers too, which need neither header
# (141 -> 162 CPU s with it). docs/building.md, "Where a CI run's time goes".
function(lt_test_precompiled_headers target)
  target_precompile_headers(${target} PRIVATE
    <gtest/gtest.h> <nlohmann/json.hpp>
    <algorithm> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional> <map> <memory> <sstream>
    <string> <vector>)
endfunction()

# lt_test_code_at_O1(TARGET): the test binary's own sources at -O1 in an optimised build (after the
# build type's -O3, so it wins). The code under test lives in llamatrain_core and the kernel
# libraries, which keep -O3; the test files are mostly gtest assertions, json and command lines,
# where -O3 buys nothing at run time and costs 40% more compile time (test_cli_options.cpp: 23.1 s at
# -O3, 13.8 s at -O1). The sanitizer build (-O0) is left as it is.
function(lt_test_code_at_O1 target)
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$" AND NOT LLAMATRAIN_SANITIZE)
    target_compile_options(${target} PRIVATE -O1)
  endif()
endfunction()
