#include "llamatrain/model_io.h"

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "llamatrain/checkpoint.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/h5_attrs.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/llama2c.h"
#include "llamatrain/model.h"

namespace lt {

namespace {

constexpr const char* kModelFormat = "llamatrain-model";
constexpr int64_t kModelFormatVersion = 1;
constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42", versions 1 and 2

Llama2Config read_config_attrs(const h5::File& f) {
  if (!f.has_attr("/", "format") || f.read_attr_string("/", "format") != kModelFormat)
    fail(strcat(f.path(), ": HDF5 file is not a llamatrain model (root attribute format != '",
                kModelFormat, "'; a dataset or checkpoint given as a model?)"));
  const int64_t version = f.read_attr_int("/", "format_version");
  if (version != kModelFormatVersion)
    fail(strcat(f.path(), ": model format_version ", version, ", this build reads ", kModelFormatVersion));
  return read_model_config_attrs(f, "/");
}

// Everything of an HDF5 model but the weights, whose shapes are checked against the config.
ModelData load_hdf5_header(const h5::File& f, const std::string& path) {
  ModelData m;
  m.config = read_config_attrs(f);
  const ParameterLayout layout(m.config);
  for (const auto& t : layout.tensors()) {
    const std::string obj = "/weights/" + t.name;
    if (!f.exists(obj)) fail(strcat(path, ": missing tensor ", obj));
    const h5::Dims dims = f.shape(obj);
    bool same = dims.size() == t.shape.size();
    for (size_t i = 0; same && i < dims.size(); ++i) same = int64_t(dims[i]) == t.shape[i];
    if (!same) {
      std::string got, want;
      for (auto d : dims) got += (got.empty() ? "" : ",") + std::to_string(d);
      for (auto d : t.shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      fail(strcat(path, ": tensor ", obj, " has shape (", got, "), expected (", want, ")"));
    }
  }
  if (f.exists("/extras"))
    for (const auto& name : f.list("/extras")) m.extras[name] = f.read<float>("/extras/" + name);
  if (has_training_record(f, "/training")) m.training = read_training_record(f, "/training");
  if (f.exists("/tokenizer/model")) {
    const auto bytes = f.read<uint8_t>("/tokenizer/model");
    m.tokenizer_model.assign(bytes.begin(), bytes.end());
  }
  return m;
}

// The flat elements [begin, end) of the weights: whole tensors read in place, a tensor cut by the
// range through the rows that hold its part (at most one row more on each side).
void read_hdf5_range(const h5::File& f, const ParameterLayout& layout, size_t begin, size_t end, float* out) {
  std::vector<float> rows;
  for (const auto& t : layout.tensors()) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    const std::string obj = "/weights/" + t.name;
    if (lo == t.offset && hi == t.offset + t.numel) {
      f.read_into(obj, out + (lo - begin), t.numel);
      continue;
    }
    const size_t row = t.numel / size_t(t.shape[0]), r0 = (lo - t.offset) / row, r1 = (hi - t.offset + row - 1) / row;
    rows.resize((r1 - r0) * row);
    f.read_rows(obj, r0, r1 - r0, rows.data());
    std::copy(rows.begin() + std::ptrdiff_t(lo - t.offset - r0 * row), rows.begin() + std::ptrdiff_t(hi - t.offset - r0 * row),
              out + (lo - begin));
  }
}

ModelData load_hdf5(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  ModelData m = load_hdf5_header(f, path);
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
  read_hdf5_range(f, layout, 0, layout.total(), m.params.data());
  return m;
}

// A checkpoint path: D/step-N (a directory with checkpoint.h5), its checkpoint.h5, D/best (the one
// train --keep-best kept), or a root D (holding `latest` or step-N directories) or D/latest.
// Returns the candidates to try, newest first, and whether the path named one checkpoint; empty
// when the path is none of these.
struct CheckpointCandidates {
  std::vector<std::string> dirs;
  bool single = false;
  std::string root;
};

bool is_checkpoint_file(const std::string& path) {
  if (std::filesystem::path(path).filename() != "checkpoint.h5" || !h5::is_hdf5_file(path)) return false;
  return true;
}

CheckpointCandidates checkpoint_candidates(const std::string& path) {
  namespace fs = std::filesystem;
  CheckpointCandidates c;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (file_exists(path + "/checkpoint.h5")) {
      c.dirs = {path};
      c.single = true;
      return c;
    }
    if (file_exists(path + "/latest") || !list_checkpoints(path).empty()) c.root = path;
  } else if (is_checkpoint_file(path)) {
    c.dirs = {fs::path(path).parent_path().string()};
    if (c.dirs[0].empty()) c.dirs[0] = ".";
    c.single = true;
    return c;
  } else if (const std::string parent = fs::path(path).parent_path().string();
             fs::path(path).filename() == "best" && !best_checkpoint(parent.empty() ? "." : parent).empty()) {
    c.dirs = {best_checkpoint(parent.empty() ? "." : parent)};
    c.single = true;
    return c;
  } else if (fs::path(path).filename() == "latest" && fs::is_regular_file(path, ec)) {
    c.root = fs::path(path).parent_path().string();
    if (c.root.empty()) c.root = ".";
  }
  // The same order as `train --resume auto`: newest complete step-N first. `latest` names the
  // newest one unless a crash came between publishing a step and updating the pointer.
  if (!c.root.empty()) c.dirs = list_checkpoints(c.root);
  return c;
}

ModelData load_one_checkpoint(const std::string& dir) {
  const CheckpointInfo ci = read_checkpoint_info(dir);
  const std::string master = dir + "/checkpoint.h5";
  if (!ci.lora.empty())
    fail(strcat(master, ": a checkpoint of a LoRA run (", ci.lora, "): its weights are the adapters, not a model; "
                "the run's model is its --output DIR/model.h5 (the adapters merged) and DIR/adapter"));
  ModelData m;
  m.format = ModelFormat::kCheckpoint;
  m.source = dir;
  m.config = Llama2Config::from_string(ci.model_config, master);
  const ParameterLayout layout(m.config);
  m.params.assign(layout.total(), 0.f);
  // [begin, end) empty: the weights only, every piece checked against its checksum.
  load_checkpoint_state(dir, layout, m.params.data(), 0, 0, nullptr, nullptr);
  h5::File f = h5::File::open_read(master);
  if (has_training_record(f, "/training")) m.training = read_training_record(f, "/training");
  if (f.exists("/tokenizer/model")) {
    const auto bytes = f.read<uint8_t>("/tokenizer/model");
    m.tokenizer_model.assign(bytes.begin(), bytes.end());
    if (!ci.tokenizer_sha256.empty() && sha256_hex(m.tokenizer_model) != ci.tokenizer_sha256)
      fail(strcat(master, ": /tokenizer/model does not match its tokenizer_sha256 (damaged checkpoint)"));
  }
  return m;
}

ModelData load_checkpoint_model(const CheckpointCandidates& c, const std::string& path) {
  if (c.single) return load_one_checkpoint(c.dirs[0]);
  if (c.dirs.empty()) fail(strcat(path, ": a checkpoint directory without any complete step-N checkpoint"));
  std::vector<std::string> notes;
  for (const std::string& dir : c.dirs) {
    try {
      ModelData m = load_one_checkpoint(dir);
      notes.push_back(strcat("using checkpoint ", dir, " (the newest usable one in ", c.root, ")"));
      m.notes = std::move(notes);
      return m;
    } catch (const Error& e) {
      notes.push_back(strcat("warning: skipping damaged checkpoint ", dir, ": ", e.what()));
    }
  }
  std::string why;
  for (const auto& n : notes) why += "\n  " + n;
  fail(strcat(path, ": no usable checkpoint in ", c.root, ": all ", c.dirs.size(), " are damaged:", why));
}

}  // namespace

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::kHdf5: return "hdf5";
    case ModelFormat::kHf: return "hf";
    case ModelFormat::kCheckpoint: return "checkpoint";
    default: return "llama2c";
  }
}

ModelFormat detect_model_format(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": model file not found"));
  if (std::filesystem::is_directory(path)) {
    if (is_hf_model(path)) return ModelFormat::kHf;
    const CheckpointCandidates c = checkpoint_candidates(path);
    if (c.single || !c.root.empty()) return ModelFormat::kCheckpoint;
    fail(strcat(path, ": a directory without ", kHfConfigFile,
                "; a Hugging Face model directory holds config.json and model.safetensors, a checkpoint "
                "directory step-N holds checkpoint.h5, a checkpoint root holds latest and step-N"));
  }
  refuse_special_file(path, "model file");
  if (const CheckpointCandidates c = checkpoint_candidates(path); c.single || !c.root.empty())
    return ModelFormat::kCheckpoint;
  if (h5::is_hdf5_file(path)) return ModelFormat::kHdf5;
  // A safetensors header length is < 100 MB; a llama2.c v0 file starts with dim and hidden_dim,
  // which as one little-endian u64 is at least 2^32, so the two cannot be confused.
  if (is_hf_model(path)) return ModelFormat::kHf;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(strcat(path, ": cannot open"));
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  if (!in) fail(strcat(path, ": too short to be a model file (", file_size(path), " bytes)"));
  if (magic == kLlama2cMagic) {
    int32_t version = 0;
    in.read(reinterpret_cast<char*>(&version), sizeof version);
    fail(strcat(path, ": llama2.c version ", version,
                " file; only the v0 (legacy) format is supported (export.py --version 0)"));
  }
  return ModelFormat::kLlama2c;
}

Llama2Config read_model_config(const std::string& path) {
  switch (detect_model_format(path)) {
    case ModelFormat::kHdf5: {
      h5::File f = h5::File::open_read(path);
      return read_config_attrs(f);
    }
    case ModelFormat::kHf:
      return read_model_config_hf(path);
    case ModelFormat::kCheckpoint: {
      const CheckpointCandidates c = checkpoint_candidates(path);
      // The config of the newest checkpoint whose checkpoint.h5 reads (load_model also checks the
      // weights, so it may fall back further).
      for (size_t i = 0; i < c.dirs.size(); ++i) {
        try {
          return Llama2Config::from_string(read_checkpoint_info(c.dirs[i]).model_config, c.dirs[i]);
        } catch (const Error&) {
          if (c.single || i + 1 == c.dirs.size()) throw;
        }
      }
      fail(strcat(path, ": a checkpoint directory without any complete step-N checkpoint"));
    }
    default: {
      std::ifstream in(path, std::ios::binary);
      char header[kLlama2cHeaderBytes];
      in.read(header, sizeof header);
      return llama2c_parse_header(std::string_view(header, size_t(in.gcount())), file_size(path), path);
    }
  }
}

ModelData load_model(const std::string& path) {
  const ModelFormat format = detect_model_format(path);
  ModelData m;
  switch (format) {
    case ModelFormat::kHdf5: m = load_hdf5(path); break;
    case ModelFormat::kHf: m = load_model_hf(path); break;
    case ModelFormat::kCheckpoint: return load_checkpoint_model(checkpoint_candidates(path), path);
    default: m = load_llama2c(path); break;
  }
  m.format = format;
  m.source = path;
  return m;
}

struct ModelFileWriter::Impl {
  std::string path, tmp;
  ParameterLayout layout;
  h5::File file;
  size_t next = 0;  // the tensor write_tensor writes
  bool finished = false;
  Impl(const std::string& p, const Llama2Config& cfg)
      : path(p), tmp(temp_path_for(p)), layout(cfg), file(h5::File::create(tmp)) {}
};

ModelFileWriter::ModelFileWriter(const std::string& path, const ModelData& m)
    : impl_(std::make_unique<Impl>(path, m.config)) {
  try {
    h5::File& f = impl_->file;
    f.write_attr("/", "format", std::string(kModelFormat));
    f.write_attr("/", "format_version", kModelFormatVersion);
    f.write_attr("/", "tool_version", std::string(LLAMATRAIN_VERSION));
    write_model_config_attrs(f, "/", m.config);
    if (m.training) write_training_record(f, "/training", *m.training);
    for (const auto& [name, v] : m.extras) f.write("/extras/" + name, {v.size()}, v.data());
    if (!m.tokenizer_model.empty())
      f.write("/tokenizer/model", {m.tokenizer_model.size()}, reinterpret_cast<const uint8_t*>(m.tokenizer_model.data()));
  } catch (...) {
    const std::string tmp = impl_->tmp;
    impl_.reset();
    std::remove(tmp.c_str());
    throw;
  }
}

ModelFileWriter::~ModelFileWriter() {
  if (!impl_ || impl_->finished) return;
  const std::string tmp = impl_->tmp;
  impl_.reset();  // closes the file (the destructor swallows HDF5's errors)
  std::remove(tmp.c_str());
}

void ModelFileWriter::write_tensor(const float* values) {
  const std::vector<TensorInfo>& tensors = impl_->layout.tensors();
  LT_CHECK(!impl_->finished && impl_->next < tensors.size(), "ModelFileWriter: ", tensors.size(),
           " tensors written already");
  const TensorInfo& t = tensors[impl_->next++];
  impl_->file.write("/weights/" + t.name, h5::Dims(t.shape.begin(), t.shape.end()), values);
}

void ModelFileWriter::finish() {
  const size_t n = impl_->layout.tensors().size();
  LT_CHECK(impl_->next == n, "ModelFileWriter: ", impl_->next, " of ", n, " tensors written");
  impl_->file.close();
  publish_file(impl_->tmp, impl_->path);
  impl_->finished = true;
}

ModelData load_model_header(const std::string& path) {
  if (detect_model_format(path) != ModelFormat::kHdf5) fail(strcat(path, ": not an HDF5 model file"));
  ModelData m = load_hdf5_header(h5::File::open_read(path), path);
  m.format = ModelFormat::kHdf5;
  m.source = path;
  return m;
}

void read_model_range(const std::string& path, const ParameterLayout& layout, size_t begin, size_t end, float* out) {
  LT_CHECK(begin <= end && end <= layout.total(), "read_model_range [", begin, ", ", end, ") of ", layout.total());
  h5::File f = h5::File::open_read(path);
  const ModelData header = load_hdf5_header(f, path);
  if (ParameterLayout(header.config).total() != layout.total())
    fail(strcat(path, ": a model of ", ParameterLayout(header.config).total(), " parameters, expected ", layout.total()));
  read_hdf5_range(f, layout, begin, end, out);
}

void save_model_hdf5(const std::string& path, const ModelData& m) {
  const ParameterLayout layout(m.config);
  LT_CHECK(m.params.size() == layout.total(), "parameter buffer has ", m.params.size(),
           " floats, layout expects ", layout.total());
  ModelFileWriter w(path, m);
  for (const auto& t : layout.tensors()) w.write_tensor(m.params.data() + t.offset);
  w.finish();
}

}  // namespace lt
