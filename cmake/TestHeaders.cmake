# lt_test_precompiled_headers(TARGET): GoogleTest, nlohmann::json and the standard headers the test
# files include, compiled once per test binary into a precompiled header instead of in every test
# file (gtest and json took 3-4 s of each test file's compile; docs/building.md, "Where a CI run's
# time goes"). Every file of the target sees them first; the files still include what they use.
function(lt_test_precompiled_headers target)
  target_precompile_headers(${target} PRIVATE
    <gtest/gtest.h> <nlohmann/json.hpp>
    <algorithm> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional> <map> <memory> <sstream>
    <string> <vector>)
endfunction()
