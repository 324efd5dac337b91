// Model files: llama2.c v0 <-> HDF5 round trips, recognition by content, and the errors for
// damaged files. Uses ../shared/data/stories260K.bin when present.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <functional>

#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
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

// The HDF5 class and byte size of attribute `name` of the root group.
std::pair<H5T_class_t, size_t> root_attr_type(const std::string& path, const char* name) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  const hid_t t = H5Aget_type(a);
  const std::pair<H5T_class_t, size_t> out = {H5Tget_class(t), H5Tget_size(t)};
  H5Tclose(t), H5Aclose(a), H5Fclose(f);
  return out;
}

// Replaces attribute `name` of the root group with a float32 one, as files before issue 14 had
// it (the float config went through float, so h5dump showed 9.9999997e-06).
void make_float32_attr(const std::string& path, const char* name, float value) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Adelete(f, name);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_FLOAT, &value);
  H5Aclose(a), H5Sclose(space), H5Fclose(f);
}

// Issue 14 §5: float config attributes are float64 holding the decimal as written (norm_eps 1e-5
// reads back as exactly 1e-5, not 9.99999974737875e-06); float32 ones from older files still load.
TEST(ModelIo, FloatConfigAttributesAreStoredAsWritten) {
  const std::string path = scratch_dir() + "/eps.h5";
  ModelData m = random_model(false);
  m.config.norm_eps = 1e-6f;
  m.config.rope_theta = 500000.f;
  save_model_hdf5(path, m);
  EXPECT_EQ(root_attr_type(path, "norm_eps"), std::make_pair(H5T_FLOAT, size_t(8)));
  EXPECT_EQ(root_attr_type(path, "rope_theta"), std::make_pair(H5T_FLOAT, size_t(8)));
  EXPECT_EQ(root_attr_type(path, "dim"), std::make_pair(H5T_INTEGER, size_t(8)));
  EXPECT_EQ(root_attr_type(path, "format").first, H5T_STRING);
  {
    const auto f = h5::File::open_read(path);
    EXPECT_EQ(f.read_attr_double("/", "norm_eps"), 1e-6);
    EXPECT_NE(double(1e-6f), 1e-6);  // what storing the float itself would have given
    EXPECT_EQ(f.read_attr_double("/", "rope_theta"), 500000.0);
  }
  EXPECT_EQ(load_model(path).config.norm_eps, 1e-6f);
  make_float32_attr(path, "norm_eps", 1e-5f);
  EXPECT_EQ(root_attr_type(path, "norm_eps"), std::make_pair(H5T_FLOAT, size_t(4)));
  EXPECT_EQ(read_model_config(path).norm_eps, 1e-5f);
}

// A model that says how it was trained keeps that record through save and load; one without
// (convert's output) has no /training group.
// ZeRO 3's --init-from: any flat range of the weights, read through the rows that hold it, is the
// same bits as the whole model's slice; the header carries everything but the weights; a file
// written tensor by tensor (ModelFileWriter) is the same model; an unfinished writer leaves nothing.
TEST(ModelIo, RangesOfTheWeightsAreTheWholeModelsSlices) {
  const std::string path = scratch_dir() + "/ranges.h5";
  ModelData m = random_model(false);
  m.tokenizer_model = "tok";
  const ParameterLayout layout(m.config);
  {
    ModelFileWriter w(path, m);
    for (const TensorInfo& t : layout.tensors()) w.write_tensor(m.params.data() + t.offset);
    w.finish();
  }
  EXPECT_EQ(load_model(path).params, m.params);
  const ModelData header = load_model_header(path);
  EXPECT_TRUE(header.params.empty());
  EXPECT_EQ(header.tokenizer_model, "tok");
  EXPECT_EQ(header.config.to_string(), m.config.to_string());
  const size_t n = layout.total();
  // Cuts inside rows, at tensor edges, single elements, the whole range, and 3 equal shards.
  std::vector<std::pair<size_t, size_t>> ranges = {{0, n}, {0, 1}, {n - 1, n}, {7, 7}, {5, 613}, {17, n - 3}};
  for (size_t r = 0; r < 3; ++r) ranges.push_back({r * ((n + 2) / 3), std::min(n, (r + 1) * ((n + 2) / 3))});
  for (const TensorInfo& t : layout.tensors()) ranges.push_back({t.offset + 1, t.offset + t.numel});
  for (const auto& [b, e] : ranges) {
    std::vector<float> got(e - b, -1.f);
    read_model_range(path, layout, b, e, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), m.params.begin() + std::ptrdiff_t(b))) << "[" << b << ", " << e << ")";
  }
  const std::string unfinished = scratch_dir() + "/unfinished.h5";
  {
    ModelFileWriter w(unfinished, m);
    w.write_tensor(m.params.data());
  }
  EXPECT_FALSE(file_exists(unfinished));
  EXPECT_FALSE(file_exists(temp_path_for(unfinished)));
}

TEST(ModelIo, TrainingRecordRoundTrips) {
  const std::string path = scratch_dir() + "/trained.h5";
  ModelData m = random_model(true);
  save_model_hdf5(path, m);
  EXPECT_FALSE(h5::File::open_read(path).exists("/training"));
  EXPECT_FALSE(load_model(path).training.has_value());
  TrainingRecord r;
  r.tool_version = "9.9.9";
  r.command_line = "llamatrain train --data 'my data.h5' --lr 3e-4";
  r.data_path = "my data.h5";
  r.steps = 120;
  r.total_steps = 300;
  r.epochs = 3;
  r.lr = 3e-4f;
  r.beta2 = 0.95f;
  r.seed = 0xfedcba9876543210ULL;
  r.zero_stage = 2;
  r.world_size = 16;
  r.train_loss = 1.25;
  r.unix_time_s = 1700000000.5;
  m.training = r;
  save_model_hdf5(path, m);
  const auto f = h5::File::open_read(path);
  EXPECT_EQ(f.read_attr_double("/training", "lr"), 3e-4);
  EXPECT_EQ(f.read_attr_double("/training", "beta2"), 0.95);
  EXPECT_FALSE(f.has_attr("/training", "eval_loss"));  // NaN: not known, not written
  const ModelData back = load_model(path);
  ASSERT_TRUE(back.training.has_value());
  EXPECT_EQ(back.training->command_line, r.command_line);
  EXPECT_EQ(back.training->steps, 120);
  EXPECT_EQ(back.training->epochs, 3);
  EXPECT_EQ(back.training->lr, 3e-4f);
  EXPECT_EQ(back.training->seed, r.seed);
  EXPECT_EQ(back.training->world_size, 16);
  EXPECT_EQ(back.training->train_loss, 1.25);
  EXPECT_TRUE(std::isnan(back.training->eval_loss));
  EXPECT_EQ(back.training->unix_time_s, 1700000000.5);
}

}  // namespace
}  // namespace lt
