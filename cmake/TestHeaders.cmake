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
