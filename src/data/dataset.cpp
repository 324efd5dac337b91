// Reading and writing the HDF5 dataset format described in dataset.h. load() validates
// everything a trainer relies on (shapes, mask values, token range) so a bad file fails at
// start-up with the file and field named, not as a wrong embedding lookup hours later.
#include "llamatrain/dataset.h"

#include <cstdio>
#include <ctime>
#include <map>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/prepare.h"

namespace lt {
namespace {

constexpr const char* kFormat = "llamatrain-dataset";
// 2: examples/ids is a string dataset and examples/label an enum; 1 had a '\n'-joined uint8 array
// and int8 codes. Both are read.
constexpr int64_t kFormatVersion = 2;
constexpr int64_t kOldestFormatVersion = 1;

// The label enum's members: the codes of ExampleSpan::label with their names (prepare.h).
h5::File::EnumMembers label_members() {
  h5::File::EnumMembers m = {{"none", -1}};
  for (int8_t code = 0; code <= 2; ++code) m.emplace_back(label_name(code), code);
  return m;
}

// Reads examples/label: an enum (its member names say which code each value is) or, from
// format 1, int8 codes.
std::vector<int8_t> read_labels(const h5::File& f, const std::string& obj) {
  if (f.kind(obj) != h5::File::Kind::kEnum) return f.read<int8_t>(obj);
  h5::File::EnumMembers members;
  const std::vector<int64_t> values = f.read_enum(obj, &members);
  std::map<int64_t, int8_t> code_of;
  for (const auto& [name, value] : members) {
    const int8_t code = label_code(name);
    if (code < 0 && name != "none")
      fail(strcat(f.path(), ": ", obj, " has a label '", name, "'; expected yes, no, maybe or none"));
    code_of[value] = code;
  }
  std::vector<int8_t> out;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto it = code_of.find(values[i]);
    if (it == code_of.end())
      fail(strcat(f.path(), ": ", obj, "[", i, "] is no member of its enum type (a value written without "
                  "conversion?)"));
    out.push_back(it->second);
  }
  return out;
}

// Reads examples/ids: one string per row or, from format 1, a uint8 array of '\n'-joined ids.
std::vector<std::string> read_ids(const h5::File& f, const std::string& obj, size_t n_examples) {
  if (f.kind(obj) == h5::File::Kind::kString) return f.read_strings(obj);
  std::vector<std::string> ids(1);
  for (uint8_t c : f.read<uint8_t>(obj)) {
    if (c == '\n') ids.emplace_back();
    else ids.back() += char(c);
  }
  if (n_examples == 0) ids.clear();
  return ids;
}

std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void save_split(h5::File& f, const std::string& group, const TokenSplit& s, int seq_len) {
  const uint64_t cols = static_cast<uint64_t>(seq_len) + 1;
  const size_t n = static_cast<size_t>(s.n_seq) * cols;
  LT_CHECK(s.seq_len == seq_len, group, ": split seq_len ", s.seq_len, " != dataset seq_len ",
           seq_len);
  LT_CHECK(s.tokens.size() == n && s.loss_mask.size() == n, group, ": ", s.n_seq, " rows of ",
           cols, " need ", n, " tokens and mask values, have ", s.tokens.size(), " and ",
           s.loss_mask.size());
  const h5::Dims dims = {static_cast<uint64_t>(s.n_seq), cols};
  f.create_group(group);
  f.write(group + "/tokens", dims, s.tokens.data(), true);
  f.write(group + "/loss_mask", dims, s.loss_mask.data(), true);
  if (s.positions.empty()) return;
  LT_CHECK(s.positions.size() == n, group, ": positions has ", s.positions.size(), " values, expected ", n);
  f.write(group + "/positions", dims, s.positions.data(), true);
  const size_t ne = s.examples.size();
  std::vector<int64_t> row(ne);
  std::vector<int32_t> offset(ne), length(ne), answer(ne);
  std::vector<int8_t> label(ne);
  std::vector<std::string> ids(ne);
  for (size_t i = 0; i < ne; ++i) {
    const ExampleSpan& e = s.examples[i];
    row[i] = e.row;
    offset[i] = e.offset;
    length[i] = e.length;
    answer[i] = e.answer_offset;
    label[i] = e.label;
    ids[i] = e.id;
  }
  const h5::Dims ed = {ne};
  f.write(group + "/examples/row", ed, row.data());
  f.write(group + "/examples/offset", ed, offset.data());
  f.write(group + "/examples/length", ed, length.data());
  f.write(group + "/examples/answer_offset", ed, answer.data());
  f.write_enum(group + "/examples/label", label, label_members());
  f.write_strings(group + "/examples/ids", ids);
}

// Optional packing information: positions restart at 0 at each example's first token and
// otherwise count up by one; examples lie inside their rows.
void load_packing(const h5::File& f, const std::string& group, TokenSplit& s) {
  const std::string& path = f.path();
  const std::string pos_name = group + "/positions";
  if (!f.exists(pos_name)) return;
  const uint64_t cols = static_cast<uint64_t>(s.seq_len) + 1;
  if (f.shape(pos_name) != h5::Dims{static_cast<uint64_t>(s.n_seq), cols})
    fail(strcat(path, ": ", pos_name, " shape differs from ", group, "/tokens"));
  s.positions = f.read<int32_t>(pos_name);
  for (size_t i = 0; i < s.positions.size(); ++i) {
    const int32_t p = s.positions[i];
    const int32_t prev = (i % cols) ? s.positions[i - 1] : -1;
    if (p != 0 && p != prev + 1)
      fail(strcat(path, ": ", pos_name, "[", i / cols, ", ", i % cols, "] = ", p,
                  ", expected 0 (an example starts) or ", prev + 1));
  }
  const std::string eg = group + "/examples";
  if (!f.exists(eg + "/row")) return;
  const auto row = f.read<int64_t>(eg + "/row");
  const auto offset = f.read<int32_t>(eg + "/offset");
  const auto length = f.read<int32_t>(eg + "/length");
  const auto answer = f.read<int32_t>(eg + "/answer_offset");
  const auto label = read_labels(f, eg + "/label");
  const size_t ne = row.size();
  if (offset.size() != ne || length.size() != ne || answer.size() != ne || label.size() != ne)
    fail(strcat(path, ": the datasets under ", eg, " differ in length"));
  std::vector<std::string> ids = read_ids(f, eg + "/ids", ne);
  if (ids.size() != ne) fail(strcat(path, ": ", eg, "/ids holds ", ids.size(), " ids for ", ne, " examples"));
  s.examples.resize(ne);
  for (size_t i = 0; i < ne; ++i) {
    ExampleSpan& e = s.examples[i];
    e.row = row[i];
    e.offset = offset[i];
    e.length = length[i];
    e.answer_offset = answer[i];
    e.label = static_cast<int8_t>(label[i]);
    e.id = std::move(ids[i]);
    if (e.row < 0 || e.row >= s.n_seq || e.offset < 0 || e.length < 1 || uint64_t(e.offset) + uint64_t(e.length) > cols ||
        e.answer_offset < 0 || e.answer_offset >= e.length)
      fail(strcat(path, ": ", eg, " example ", i, " (row ", e.row, ", offset ", e.offset, ", length ", e.length,
                  ", answer_offset ", e.answer_offset, ") lies outside its row"));
  }
}

// Reads /<group>/{tokens,loss_mask} and checks them against the root attributes.
TokenSplit load_split(const h5::File& f, const std::string& group, int seq_len, int vocab_size, int max_weight) {
  const std::string& path = f.path();
  TokenSplit s;
  s.seq_len = seq_len;
  const uint64_t cols = static_cast<uint64_t>(seq_len) + 1;
  const std::string tok_name = group + "/tokens", mask_name = group + "/loss_mask";
  for (const auto& name : {tok_name, mask_name})
    if (!f.exists(name)) fail(strcat(path, ": missing dataset ", name));
  const h5::Dims td = f.shape(tok_name), md = f.shape(mask_name);
  if (td.size() != 2)
    fail(strcat(path, ": ", tok_name, " has ", td.size(), " dimensions, expected 2 (n_seq, seq_len+1)"));
  if (td[1] != cols)
    fail(strcat(path, ": ", tok_name, " has ", td[1], " columns, expected seq_len+1 = ", cols));
  if (md != td)
    fail(strcat(path, ": ", mask_name, " shape differs from ", tok_name, " (", td[0], " x ",
                td[1], ")"));
  s.n_seq = static_cast<int64_t>(td[0]);
  s.tokens = f.read<int32_t>(tok_name);
  s.loss_mask = f.read<uint8_t>(mask_name);
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const int32_t t = s.tokens[i];
    if (t < 0 || t >= vocab_size)
      fail(strcat(path, ": ", tok_name, "[", i / cols, ", ", i % cols, "] = ", t,
                  " is outside [0, vocab_size = ", vocab_size, ")"));
  }
  for (size_t i = 0; i < s.loss_mask.size(); ++i) {
    const uint8_t m = s.loss_mask[i];
    if (m > max_weight)
      fail(strcat(path, ": ", mask_name, "[", i / cols, ", ", i % cols, "] = ", int(m),
                  max_weight == 1 ? std::string(", expected 0 or 1")
                                  : strcat(", expected 0..", max_weight, " (the attribute decision_weight)")));
  }
  return s;
}

}  // namespace

int64_t TokenSplit::loss_tokens() const {
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m;
  return n;
}

void Dataset::save(const std::string& out_path) const {
  LT_CHECK(info.seq_len >= 1, out_path, ": seq_len ", info.seq_len, " < 1");
  const std::string tmp = temp_path_for(out_path);
  try {
    h5::File f = h5::File::create(tmp);
    f.write_attr("/", "format", std::string(kFormat));
    f.write_attr("/", "format_version", kFormatVersion);
    f.write_attr("/", "seq_len", int64_t{info.seq_len});
    f.write_attr("/", "vocab_size", int64_t{info.vocab_size});
    f.write_attr("/", "bos_id", int64_t{info.bos_id});
    f.write_attr("/", "eos_id", int64_t{info.eos_id});
    f.write_attr("/", "tokenizer_sha256", info.tokenizer_sha256);
    f.write_attr("/", "source_sha256", info.source_sha256);
    f.write_attr("/", "source_path", info.source_path);
    f.write_attr("/", "prompt_template", info.prompt_template);
    f.write_attr("/", "tool_version", info.tool_version);
    // HDF5 attributes here are signed 64-bit; a seed above 2^63 is stored as its two's-complement
    // bit pattern and restored exactly by load().
    f.write_attr("/", "seed", static_cast<int64_t>(info.seed));
    f.write_attr("/", "test_split", info.test_split);
    f.write_attr("/", "created_utc", utc_now_iso());
    f.write_attr("/", "prompt_type", int64_t{info.prompt_type});
    f.write_attr("/", "train_on_prompt", int64_t{info.train_on_prompt ? 1 : 0});
    f.write_attr("/", "decision_weight", int64_t{info.decision_weight});
    if (!info.prompt_format.empty()) f.write_attr("/", "prompt_format", info.prompt_format);
    if (!info.answer_field.empty()) f.write_attr("/", "answer_field", info.answer_field);
    f.write_attr("/", "test_ids_path", info.test_ids_path);
    f.write_attr("/", "test_ids_sha256", info.test_ids_sha256);
    if (!info.curation_report.empty()) f.write_attr("/", "curation_report", info.curation_report);
    if (!tokenizer_model.empty()) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(tokenizer_model.data());
      f.write("/tokenizer/model", {tokenizer_model.size()}, bytes);
    }
    save_split(f, "/train", train, info.seq_len);
    save_split(f, "/test", test, info.seq_len);
    f.close();
    publish_file(tmp, out_path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

Dataset Dataset::load(const std::string& in_path) {
  h5::File f = h5::File::open_read(in_path);
  Dataset d;
  d.path = in_path;
  if (!f.has_attr("/", "format"))
    fail(strcat(in_path, ": not a llamatrain dataset (no format attribute on /)"));
  const std::string format = f.read_attr_string("/", "format");
  if (format != kFormat)
    fail(strcat(in_path, ": format attribute is '", format, "', expected '", kFormat, "'"));
  const int64_t version = f.read_attr_int("/", "format_version");
  if (version < kOldestFormatVersion || version > kFormatVersion)
    fail(strcat(in_path, ": format_version ", version, " is not supported (this build reads ",
                kOldestFormatVersion, " to ", kFormatVersion, ")"));

  DatasetInfo& info = d.info;
  const int64_t seq_len = f.read_attr_int("/", "seq_len");
  const int64_t vocab_size = f.read_attr_int("/", "vocab_size");
  if (seq_len < 1 || seq_len > (int64_t{1} << 30))
    fail(strcat(in_path, ": attribute seq_len = ", seq_len, " is out of range"));
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 30))
    fail(strcat(in_path, ": attribute vocab_size = ", vocab_size, " is out of range"));
  info.seq_len = static_cast<int>(seq_len);
  info.vocab_size = static_cast<int>(vocab_size);
  // Descriptive attributes are optional so that files written by other tools still load.
  auto opt_int = [&](const char* name, int64_t fallback) {
    return f.has_attr("/", name) ? f.read_attr_int("/", name) : fallback;
  };
  auto opt_str = [&](const char* name, const std::string& fallback) {
    return f.has_attr("/", name) ? f.read_attr_string("/", name) : fallback;
  };
  // A special token's id: -1 (the tokenizer has none) or a token of the vocabulary.
  auto special_id = [&](const char* name, int fallback) {
    const int64_t id = opt_int(name, fallback);
    if (id < -1 || id >= vocab_size)
      fail(strcat(in_path, ": attribute ", name, " = ", id, " is out of range; expected -1 (none) or a token id below ",
                  "vocab_size ", vocab_size));
    return static_cast<int>(id);
  };
  info.bos_id = special_id("bos_id", info.bos_id);
  info.eos_id = special_id("eos_id", info.eos_id);
  info.seed = static_cast<uint64_t>(opt_int("seed", 0));
  info.test_split = f.has_attr("/", "test_split") ? f.read_attr_double("/", "test_split") : 0.0;
  info.tokenizer_sha256 = opt_str("tokenizer_sha256", "");
  info.source_sha256 = opt_str("source_sha256", "");
  info.source_path = opt_str("source_path", "");
  info.prompt_template = opt_str("prompt_template", "none");
  info.tool_version = opt_str("tool_version", "");
  info.prompt_type = static_cast<int>(opt_int("prompt_type", 0));
  info.train_on_prompt = opt_int("train_on_prompt", 0) != 0;
  const int64_t weight = opt_int("decision_weight", 1);
  if (weight < 1 || weight > 255) fail(strcat(in_path, ": attribute decision_weight = ", weight, ", expected 1..255"));
  info.decision_weight = int(weight);
  info.prompt_format = opt_str("prompt_format", "");
  info.answer_field = opt_str("answer_field", "");
  info.test_ids_path = opt_str("test_ids_path", "");
  info.test_ids_sha256 = opt_str("test_ids_sha256", "");
  info.curation_report = opt_str("curation_report", "");

  if (f.exists("/tokenizer/model")) {
    const auto bytes = f.read<uint8_t>("/tokenizer/model");
    d.tokenizer_model.assign(bytes.begin(), bytes.end());
    if (!info.tokenizer_sha256.empty() && sha256_hex(d.tokenizer_model) != info.tokenizer_sha256)
      fail(strcat(in_path, ": /tokenizer/model does not match attribute tokenizer_sha256"));
  }
  if (!f.exists("/train")) fail(strcat(in_path, ": missing group /train"));
  d.train = load_split(f, "/train", info.seq_len, info.vocab_size, info.decision_weight);
  load_packing(f, "/train", d.train);
  // A file without /test simply has no held-out rows (our writer always writes the group).
  if (f.exists("/test")) {
    d.test = load_split(f, "/test", info.seq_len, info.vocab_size, info.decision_weight);
    load_packing(f, "/test", d.test);
  } else {
    d.test.seq_len = info.seq_len;
  }
  return d;
}

}  // namespace lt
