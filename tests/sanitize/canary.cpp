// The sanitizer build's canary (built only with LLAMATRAIN_SANITIZE): one deliberate defect per
// check the build promises, chosen by the first argument. Its tests (tests/CMakeLists.txt,
// Sanitize.*) pass only when the sanitizer reports the defect, so a build whose checks were
// silently lost (flags dropped, runtime not linked, options turned off) fails them.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int heap_overflow(int one) {
  char* buffer = new char[8]();
  volatile int index = 7 + one;  // 8: one past the end
  buffer[index] = 1;
  const int value = buffer[0];
  delete[] buffer;
  return value;
}

int signed_overflow(int one) {
  volatile int big = INT_MAX;
  const int sum = big + one;  // INT_MAX + 1
  return sum == 0;
}

int leak(int one) {
  static void* volatile lost;
  lost = std::malloc(64 * static_cast<size_t>(one));
  lost = nullptr;  // the only pointer to the block, dropped
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "";
  const int one = argc - 1;  // 1: keeps the compiler from seeing the defects as constants
  if (std::strcmp(which, "heap-overflow") == 0) return heap_overflow(one);
  if (std::strcmp(which, "signed-overflow") == 0) return signed_overflow(one);
  if (std::strcmp(which, "leak") == 0) return leak(one);
  std::fprintf(stderr, "usage: sanitize_canary heap-overflow|signed-overflow|leak\n");
  return 2;
}
