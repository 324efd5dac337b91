// Model files: llama2.c v0 <-> HDF5 round trips, recognition by content, and the errors for
// damaged files. Uses ../shared/data/stories260K.bin when present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>

#include "llamatrain/fsutil.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "test_util.h"

namespace lt {
namespace {

const std::string kShared = testing::kSharedData;
using testing::error_of;
std::string scratch_dir() { return testing::scratch(); }



ModelData random_model(bool tied) {
  Llama2Config c = preset_config("tiny");
  c.dim = 16;
  c.hidden_dim = 40;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 37;
  c.max_seq_len = 12;
  c.tied_embeddings = tied;
  Llama2Model m(c);
  m.init_random(tied ? 1 : 2);
  ModelData d;
  d.config = c;
  d.params = m.params();
  return d;
}

TEST(ModelIo, Llama2cRoundTripThroughHdf5IsByteIdenticalForSyntheticModels) {
  for (bool tied : {true, false}) {
    const ModelData m = random_model(tied);
    const std::string bin = scratch_dir() + (tied ? "/t.bin" : "/u.bin");
    const std::string h5 = scratch_dir() + (tied ? "/t.h5" : "/u.h5");
    const std::string bin2 = scratch_dir() + (tied ? "/t2.bin" : "/u2.bin");
    save_model_llama2c(bin, m);
    EXPECT_EQ(detect_model_format(bin), ModelFormat::kLlama2c);
    const ModelData a = load_model(bin);
    EXPECT_EQ(a.config.tied_embeddings, tied);
    EXPECT_EQ(a.params, m.params);
    save_model_hdf5(h5, a);
    EXPECT_EQ(detect_model_format(h5), ModelFormat::kHdf5);
    const ModelData b = load_model(h5);
    EXPECT_EQ(b.params, m.params);
    EXPECT_EQ(b.config.to_string(), m.config.to_string());
    save_model_llama2c(bin2, b);
    EXPECT_EQ(sha256_file(bin), sha256_file(bin2)) << "tied=" << tied;
  }
}

TEST(ModelIo, Stories260kLoadsAndRoundTripsByteIdentical) {
  const std::string bin = kShared + "/stories260K.bin";
  if (!file_exists(bin)) GTEST_SKIP() << bin << " absent (../shared/data not present)";
  const ModelData m = load_model(bin);
  EXPECT_EQ(m.config.dim, 64);
  EXPECT_EQ(m.config.hidden_dim, 172);
  EXPECT_EQ(m.config.n_layers, 5);
  EXPECT_EQ(m.config.n_heads, 8);
  EXPECT_EQ(m.config.n_kv_heads, 4);
  EXPECT_EQ(m.config.vocab_size, 512);
  EXPECT_EQ(m.config.max_seq_len, 512);
  EXPECT_TRUE(m.config.tied_embeddings);
  const std::string h5 = scratch_dir() + "/s.h5", back = scratch_dir() + "/s.bin";
  save_model_hdf5(h5, m);
  save_model_llama2c(back, load_model(h5));
  EXPECT_EQ(file_size(back), 1056540u);
  EXPECT_EQ(sha256_file(bin), sha256_file(back));
}

TEST(ModelIo, DamagedFilesAreReportedWithTheFileAndTheProblem) {
  const ModelData m = random_model(true);
  const std::string good = scratch_dir() + "/good.bin";
  save_model_llama2c(good, m);
  const std::string bytes = read_file_bytes(good);

  const std::string truncated = scratch_dir() + "/truncated.bin";
  write_file_atomic(truncated, bytes.substr(0, bytes.size() - 100));
  std::string e = error_of([&] { load_model(truncated); });
  EXPECT_NE(e.find(truncated), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  const std::string oversized = scratch_dir() + "/oversized.bin";
  write_file_atomic(oversized, bytes + std::string(64, '\0'));
  e = error_of([&] { load_model(oversized); });
  EXPECT_NE(e.find("trailing"), std::string::npos) << e;

  // A header that disagrees with the size: n_layers doubled.
  std::string wrong = bytes;
  int32_t layers = 0;
  std::memcpy(&layers, wrong.data() + 8, 4);
  layers *= 2;
  std::memcpy(wrong.data() + 8, &layers, 4);
  const std::string wrong_path = scratch_dir() + "/wrong_header.bin";
  write_file_atomic(wrong_path, wrong);
  e = error_of([&] { load_model(wrong_path); });
  EXPECT_NE(e.find("n_layers=" + std::to_string(layers)), std::string::npos) << e;
  EXPECT_NE(e.find("bytes"), std::string::npos) << e;

  const std::string tiny = scratch_dir() + "/tiny.bin";
  write_file_atomic(tiny, "ab");
  EXPECT_NE(error_of([&] { load_model(tiny); }).find(tiny), std::string::npos);

  std::string v1 = bytes;
  const uint32_t magic = 0x616b3432;
  std::memcpy(v1.data(), &magic, 4);
  const std::string v1_path = scratch_dir() + "/v1.bin";
  write_file_atomic(v1_path, v1);
  EXPECT_NE(error_of([&] { load_model(v1_path); }).find("only the v0"), std::string::npos);

  EXPECT_NE(error_of([&] { load_model(scratch_dir() + "/missing.bin"); }).find("not found"), std::string::npos);
}

}  // namespace
}  // namespace lt
