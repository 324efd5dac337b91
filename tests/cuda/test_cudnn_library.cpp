// The dlopen loader behind --attention cudnn (src/backend/cuda/cudnn_library.h), without a GPU:
// a library that cannot be loaded gives a message naming what was tried and the way out, and on a
// machine with cuDNN 9 installed (the CUDA toolkit's directories) it loads and reports version 9, and
// accepts every descriptor of the attention graphs.
// Each test runs in its own process (gtest_discover_tests), so the environment set here stays here.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/cudnn_library.h"
#include "llamatrain/error.h"

namespace {

TEST(CudnnLibrary, AbsentLibraryNamesThePathTriedAndTheWayOut) {
  const std::string bogus = "/nonexistent/llamatrain-test/libcudnn.so.9";
  ASSERT_EQ(setenv("LLAMATRAIN_CUDNN_LIBRARY", bogus.c_str(), 1), 0);
  try {
    const size_t v = lt::cudnn::library_version();
    ADD_FAILURE() << "loaded cuDNN " << v << " from a path that does not exist";
  } catch (const lt::Error& e) {
    const std::string what = e.what();
    std::printf("the message: %s\n", what.c_str());
    EXPECT_NE(what.find("--attention cudnn needs cuDNN 9"), std::string::npos) << what;
    EXPECT_NE(what.find(bogus), std::string::npos) << what;                    // what was tried
    EXPECT_NE(what.find("No such file"), std::string::npos) << what;           // and why it failed
    EXPECT_NE(what.find("LLAMATRAIN_CUDNN_LIBRARY"), std::string::npos) << what;
    EXPECT_NE(what.find("--attention native"), std::string::npos) << what;
  }
  // Not cached: the next call tries again (here: the same bogus path, the same answer).
  EXPECT_THROW(lt::cudnn::library_version(), lt::Error);
}

TEST(CudnnLibrary, InstalledLibraryLoadsWithoutAGpu) {
  unsetenv("LLAMATRAIN_CUDNN_LIBRARY");
  size_t v = 0;
  try {
    v = lt::cudnn::library_version();
  } catch (const lt::Error& e) {
    GTEST_SKIP() << "cuDNN is not installed here: " << e.what();
  }
  EXPECT_GE(v, 90000u);
  EXPECT_LT(v, 100000u);
}

// Every tensor and operation of both graphs is accepted by cuDNN (types, and shapes that fit each
// matmul, pointwise op, reduction and reshape), for MHA, GQA and MQA; only the engines need a GPU.
TEST(CudnnLibrary, AttentionGraphDescriptorsFinalizeWithoutAGpu) {
  unsetenv("LLAMATRAIN_CUDNN_LIBRARY");
  try {
    lt::cudnn::library_version();
  } catch (const lt::Error& e) {
    GTEST_SKIP() << "cuDNN is not installed here: " << e.what();
  }
  struct Shape {
    int B, T, H, KVH, hd;
  };
  for (const Shape s : {Shape{2, 37, 4, 4, 64}, Shape{1, 70, 4, 2, 32}, Shape{1, 100, 2, 1, 128}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KVH=" << s.KVH
                                      << " hd=" << s.hd);
    EXPECT_NO_THROW(lt::cudnn::check_attention_descriptors(s.B, s.T, s.H, s.KVH, s.hd));
  }
}

}  // namespace
