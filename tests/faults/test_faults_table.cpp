// Bad input to every parser and option (issue 15, item 11), as one table: each case is a command
// line, the exit status it must end with (1) and a piece of the message it must print. The
// parsers: hostfiles, config files (--config, TOML), datasets, model files (llama2.c .bin, HF
// safetensors and config.json, HDF5), question/answer records (prepare --qa), tokenizers, metrics
// files (plan --calibrate); and every numeric option of every subcommand, taken from its --help
// (each states its range) and given a value outside the range, a non-number and, for floats, NaN.
// The cases run a few at a time; the whole table takes well under a minute.
//
// Other tests check some of these messages word for word (tests/test_cli*.cpp, test_hostfile.cpp,
// test_hf.cpp, ...); this table is where the fault suite counts them, and adds the cases they do
// not have.
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>

#include "faults/fault_cases.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using faults::Outcome;

const std::string kFixtures = std::string(LLAMATRAIN_SOURCE_DIR) + "/tests/fixtures";

std::string dir() {
  static const std::string d = [] {
    const std::string p = testing::scratch() + "/table";
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// Writes `bytes` to dir()/name and returns the path.
std::string file(const std::string& name, const std::string& bytes) {
  const std::string p = dir() + "/" + name;
  fs::create_directories(fs::path(p).parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  return p;
}

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// A safetensors file: the 8-byte header length, the header, then `data`.
std::string safetensors(const std::string& header, const std::string& data = "") {
  return u64(header.size()) + header + data;
}

// An HF directory: the fixture's config.json (or `config`) beside `weights` as model.safetensors.
std::string hf_dir(const std::string& name, const std::string& weights, const std::string& config = "") {
  const std::string d = dir() + "/" + name;
  fs::create_directories(d);
  fs::copy_file(config.empty() ? kFixtures + "/hf_tiny/f16/config.json" : config, d + "/config.json",
                fs::copy_options::overwrite_existing);
  if (!weights.empty()) std::ofstream(d + "/model.safetensors", std::ios::binary | std::ios::trunc) << weights;
  else fs::copy_file(kFixtures + "/hf_tiny/f16/model.safetensors", d + "/model.safetensors",
                     fs::copy_options::overwrite_existing);
  return d;
}

// The fixture's config.json with one edit: the text `from` replaced by `to`.
std::string hf_config(const std::string& name, const std::string& from, const std::string& to) {
  std::string c = testing::slurp(kFixtures + "/hf_tiny/f16/config.json");
  const size_t at = c.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) c.replace(at, from.size(), to);
  const std::string path = file(name + ".config.json", c);
  return hf_dir(name, "", path);
}

// The tiny llama2.c fixture with its header edited: `field` (0..6) set to `value`.
std::string bin_with(const std::string& name, int field, int32_t value) {
  std::string b = testing::slurp(kFixtures + "/llama2c_tiny.bin");
  std::memcpy(&b[size_t(field) * 4], &value, 4);
  return file(name, b);
}

// A small real dataset (made once for the build, read only) and a copy of it with one attribute changed.
const std::string& dataset() {
  static const std::string p = faults::tales_v300_s32() + "/tales.h5";
  return p;
}

std::string dataset_with_attr(const std::string& name, const std::string& attr, int64_t value) {
  const std::string p = dir() + "/" + name;
  fs::copy_file(dataset(), p, fs::copy_options::overwrite_existing);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t a = H5Aopen_by_name(f, "/", attr.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(a, 0) << attr;
  H5Awrite(a, H5T_NATIVE_INT64, &value);
  H5Aclose(a);
  H5Fclose(f);
  return p;
}

// A copy of the dataset with one token of /train/tokens set to `token`.
std::string dataset_with_token(const std::string& name, int32_t token) {
  const std::string p = dir() + "/" + name;
  fs::copy_file(dataset(), p, fs::copy_options::overwrite_existing);
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, "/train/tokens", H5P_DEFAULT);
  const hid_t space = H5Dget_space(d);
  const hsize_t start[2] = {3, 5}, count[2] = {1, 1};
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
  const hid_t mem = H5Screate_simple(1, count, nullptr);
  H5Dwrite(d, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, &token);
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  return p;
}

struct Case {
  std::string group, name, args;  // args: after `llamatrain`
  std::string needle;
  int status = 1;
};

std::vector<Case> file_cases() {
  const std::string out = dir() + "/out";
  const std::string plan = "plan --model-config tiny --seq-len 32 --tokens 100000 --global-batch 8 --hostfile ";
  const std::string qa = "prepare --prompt-type 3 --vocab-size 300 --seq-len 64 --output " + out + "/qa.h5 --qa ";
  const std::string tok = "prepare --text builtin:tinytales --seq-len 32 --output " + out + "/t.h5 --tokenizer ";
  const std::string train = "train --model-config tiny --vocab-size 300 --max-steps 1 --no-progress --data ";
  const std::string conv = [&] { return "convert --output " + out + "/m.h5 --input "; }();
  const std::string cfg = "--config ";
  const std::string bin = testing::slurp(kFixtures + "/llama2c_tiny.bin");
  const std::string f16 = testing::slurp(kFixtures + "/hf_tiny/f16/model.safetensors");
  std::vector<Case> c = {
      // ---- hostfiles (plan --hostfile, info --hostfile; valid for mpirun --hostfile) ----
      {"hostfile", "missing", plan + dir() + "/absent-hosts", "absent-hosts"},
      {"hostfile", "empty", plan + file("h_empty", ""), "no hosts; expected at least one line"},
      {"hostfile", "only comments", plan + file("h_comments", "# nothing\n\n"), "no hosts"},
      {"hostfile", "slots=0", plan + file("h_slots0", "node1 slots=0\n"), "h_slots0:1: slots=0: expected a positive integer"},
      {"hostfile", "slots=-3", plan + file("h_slotsneg", "node1 slots=-3\n"), "slots=-3: expected a positive integer"},
      {"hostfile", "slots=2x", plan + file("h_slotsx", "node1 slots=2x\n"), "expected a positive integer"},
      {"hostfile", "slots=99999999999", plan + file("h_slotsbig", "node1 slots=99999999999\n"),
       "expected a positive integer"},
      {"hostfile", "slots twice", plan + file("h_twice", "node1 slots=2 slots=3\n"), "slots= given twice"},
      {"hostfile", "unknown key", plan + file("h_key", "node1 cpus=4\n"), "unknown key 'cpus'"},
      {"hostfile", "key without =", plan + file("h_noeq", "node1 slots 4\n"), "expected slots=N"},
      {"hostfile", "max_slots below slots", plan + file("h_max", "node1 slots=4 max_slots=2\n"),
       "max_slots=2: expected at least slots=4"},
      {"hostfile", "host twice", plan + file("h_dup", "node1 slots=2\nnode1 slots=2\n"), "host already listed on line 1"},
      {"hostfile", "bad host name", plan + file("h_name", "no/de slots=2\n"), "expected a host name"},
      {"hostfile", "unknown GPU", plan + file("h_gpu", "node1 slots=2 # gpu=B300-FOO\n"), "unknown GPU type 'B300-FOO'"},
      {"hostfile", "gpus= without gpu=", plan + file("h_gpus", "node1 slots=2 # gpus=2\n"), "expected gpu=<type> too"},
      {"hostfile", "nic_gbps=0", plan + file("h_nic", "node1 slots=2 # gpu=A100-SXM4-80GB nic_gbps=0\n"),
       "expected a positive number (Gb/s"},
      {"hostfile", "unknown annotation", plan + file("h_ann", "node1 slots=2 # gpu=A100-SXM4-80GB speed=9\n"),
       "unknown annotation key 'speed'"},
      {"hostfile", "comment at end without newline", plan + file("h_eof", "node1 slots=2 # gpu=A100-SXM4-80GB"),
       "the file ends inside a comment"},
      {"hostfile", "binary garbage", plan + file("h_bin", std::string("\x7f" "ELF\x02\x01\x01\0\0\0\n", 11)),
       "h_bin:1:"},
      {"hostfile", "info --hostfile, slots=0", "info --hostfile " + dir() + "/h_slots0", "slots=0: expected a positive integer"},
      // ---- config files (--config, TOML) ----
      {"config", "missing", cfg + dir() + "/absent.toml train --data x.h5", "config file not found (--config)"},
      {"config", "unknown key", cfg + file("c_key.toml", "[train]\nmax_stepz = 3\n") + " train --data x.h5",
       "c_key.toml:2: unknown key 'max_stepz' in [train]; did you mean 'max-steps'?"},
      {"config", "unknown section", cfg + file("c_sec.toml", "[trian]\nmax_steps = 3\n") + " train --data x.h5",
       "c_sec.toml:1:"},
      {"config", "value out of range", cfg + file("c_range.toml", "[train]\nmax_steps = 0\n") + " train --data x.h5",
       "c_range.toml:2:"},
      {"config", "value of the wrong kind", cfg + file("c_kind.toml", "[train]\nmax_steps = \"ten\"\n") + " train --data x.h5",
       "c_kind.toml:2:"},
      {"config", "float for an integer", cfg + file("c_float.toml", "[train]\nmax_steps = 2.5\n") + " train --data x.h5",
       "c_float.toml:2:"},
      {"config", "no '='", cfg + file("c_noeq.toml", "[train]\nmax_steps 3\n") + " train --data x.h5",
       "c_noeq.toml:2: expected '=' after max_steps"},
      {"config", "unterminated string", cfg + file("c_str.toml", "[train]\ndata = \"x.h5\n") + " train",
       "c_str.toml:2: data = unterminated string"},
      {"config", "section twice", cfg + file("c_twice.toml", "[train]\n[train]\n") + " train --data x.h5",
       "section [train] given twice (first on line 1)"},
      {"config", "key twice", cfg + file("c_keytwice.toml", "[train]\nlr = 1e-3\nlr = 2e-3\n") + " train --data x.h5",
       "lr given twice in [train] (first on line 2)"},
      {"config", "array of tables", cfg + file("c_aot.toml", "[[train]]\n") + " train --data x.h5",
       "arrays of tables ([[...]]) are not supported"},
      {"config", "nested section", cfg + file("c_nest.toml", "[train.opt]\n") + " train --data x.h5",
       "nested sections are not supported"},
      {"config", "text after the value", cfg + file("c_after.toml", "[train]\nmax_steps = 3 4\n") + " train --data x.h5",
       "c_after.toml:2: unexpected text after the value"},
      {"config", "binary garbage", cfg + file("c_bin.toml", std::string("\0\x01\x02[\xff\n", 6)) + " train --data x.h5",
       "c_bin.toml:1:"},
      // ---- datasets (train --data, eval --data) ----
      {"dataset", "missing", train + dir() + "/absent.h5", "absent.h5"},
      {"dataset", "not HDF5 (text)", train + file("d_text.h5", "hello, this is not HDF5\n"), "d_text.h5"},
      {"dataset", "empty file", train + file("d_empty.h5", ""), "d_empty.h5"},
      {"dataset", "truncated to half", train + file("d_half.h5", testing::slurp(dataset()).substr(0, fs::file_size(dataset()) / 2)),
       "d_half.h5"},
      {"dataset", "a model file, not a dataset", train + dir() + "/model.h5",
       "format attribute is 'llamatrain-model', expected 'llamatrain-dataset'"},
      {"dataset", "format_version 99", train + dataset_with_attr("d_v99.h5", "format_version", 99),
       "format_version 99 is not supported"},
      {"dataset", "seq_len 0", train + dataset_with_attr("d_seq0.h5", "seq_len", 0), "attribute seq_len = 0 is out of range"},
      {"dataset", "vocab_size -1", train + dataset_with_attr("d_vocab.h5", "vocab_size", -1),
       "attribute vocab_size = -1 is out of range"},
      {"dataset", "bos_id -7", train + dataset_with_attr("d_bos.h5", "bos_id", -7),
       "attribute bos_id = -7 is out of range; expected -1 (none) or a token id below vocab_size"},
      {"dataset", "eos_id = vocab_size", train + dataset_with_attr("d_eos.h5", "eos_id", 300),
       "attribute eos_id = 300 is out of range"},
      {"dataset", "token outside the vocabulary", train + dataset_with_token("d_tok.h5", 70000), "/train/tokens[3, 5] = 70000"},
      {"dataset", "negative token", train + dataset_with_token("d_tokneg.h5", -2), "/train/tokens[3, 5] = -2"},
      {"dataset", "eval --data not HDF5", "eval --model " + kFixtures + "/llama2c_tiny.bin --data " + dir() + "/d_text.h5",
       "d_text.h5"},
      // ---- model files (convert --input; every loader shares the readers) ----
      {"model", "missing", conv + dir() + "/absent.bin", "absent.bin: model file not found"},
      {"model", "empty", conv + file("m_empty.bin", ""), "m_empty.bin: too short to be a model file (0 bytes)"},
      {"model", ".bin of 10 bytes", conv + file("m_short.bin", bin.substr(0, 10)), "m_short.bin"},
      {"model", ".bin truncated", conv + file("m_trunc.bin", bin.substr(0, bin.size() - 100)), "(truncated?)"},
      {"model", ".bin with extra bytes", conv + file("m_long.bin", bin + std::string(64, '\0')), "m_long.bin"},
      {"model", ".bin dim 0", conv + bin_with("m_dim0.bin", 0, 0), "not a valid llama2.c v0 model"},
      {"model", ".bin negative n_layers", conv + bin_with("m_layers.bin", 2, -4), "not a valid llama2.c v0 model"},
      {"model", ".bin n_heads not dividing dim", conv + bin_with("m_heads.bin", 3, 3), "m_heads.bin"},
      {"model", ".bin n_kv_heads above n_heads", conv + bin_with("m_kv.bin", 4, 64), "m_kv.bin"},
      {"model", ".bin huge dim", conv + bin_with("m_huge.bin", 0, 1 << 30), "m_huge.bin"},
      {"model", "llama2.c output of max_seq_len 2^31-1 (std::bad_alloc before)",
       "convert --input " + dir() + "/long/model.h5 --to llama2c --output " + out + "/long.bin",
       "the model's max_seq_len 2147483647 is above the 16777216 the llama2.c format holds"},
      {"model", "llama2.c v1 file", conv + file("m_v1.bin", u32(0x616b3432) + u32(1) + std::string(256, '\0')),
       "only the v0 (legacy) format is supported"},
      {"model", "safetensors: header length past the end", conv + hf_dir("st_len", u64(1000) + "{}"),
       "reaches past the end of the file"},
      {"model", "safetensors: header length above 100 MB", conv + hf_dir("st_huge", u64(uint64_t(1) << 40) + "{}"),
       "safetensors header length 1099511627776 exceeds"},
      {"model", "safetensors: 4 bytes", conv + hf_dir("st_tiny", "abcd"), "too short for a safetensors file"},
      {"model", "safetensors: header not JSON", conv + hf_dir("st_json", safetensors("{\"a\": [1, 2")),
       "safetensors header is not valid JSON"},
      {"model", "safetensors: header not an object", conv + hf_dir("st_arr", safetensors("[1, 2, 3]")),
       "does not start with '{'"},
      {"model", "safetensors: unknown dtype",
       conv + hf_dir("st_dtype", safetensors(R"({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})",
                                             std::string(8, '\0'))),
       "safetensors tensor 'x'"},
      {"model", "safetensors: offsets past the data",
       conv + hf_dir("st_off", safetensors(R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                                           std::string(8, '\0'))),
       "safetensors tensor 'x'"},
      {"model", "safetensors: shape and bytes disagree",
       conv + hf_dir("st_shape", safetensors(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                                             std::string(8, '\0'))),
       "safetensors tensor 'x'"},
      {"model", "safetensors: overlapping tensors",
       conv + hf_dir("st_overlap", safetensors(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
                                               R"("y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                               std::string(12, '\0'))),
       "overlap"},
      {"model", "safetensors: shape overflows",
       conv + hf_dir("st_ovf", safetensors(R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 8], )"
                                           R"("data_offsets": [0, 8]}})",
                                           std::string(8, '\0'))),
       "safetensors tensor 'x'"},
      {"model", "safetensors: a tensor missing", conv + hf_dir("st_missing", safetensors("{}")), "is missing"},
      {"model", "safetensors: truncated data", conv + hf_dir("st_trunc", f16.substr(0, f16.size() - 40)), "st_trunc"},
      {"model", "config.json: not JSON", conv + [&] {
         const std::string d = hf_dir("cfg_json", "");
         std::ofstream(d + "/config.json", std::ios::trunc) << "{\"hidden_size\": ";
         return d;
       }(), "config.json: not valid JSON"},
      {"model", "config.json: an array", conv + [&] {
         const std::string d = hf_dir("cfg_arr", "");
         std::ofstream(d + "/config.json", std::ios::trunc) << "[1]";
         return d;
       }(), "config.json: not a JSON object"},
      {"model", "config.json: hidden_size missing", conv + hf_config("cfg_nodim", "\"hidden_size\": 8,", ""),
       "missing field \"hidden_size\""},
      {"model", "config.json: hidden_size a string", conv + hf_config("cfg_str", "\"hidden_size\": 8", "\"hidden_size\": \"8\""),
       "field \"hidden_size\""},
      {"model", "config.json: hidden_size -8", conv + hf_config("cfg_neg", "\"hidden_size\": 8", "\"hidden_size\": -8"),
       "field \"hidden_size\""},
      {"model", "config.json: rope_scaling", conv + hf_config("cfg_rope", "\"rope_theta\"", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}, \"rope_theta\""),
       "rope_scaling"},
      {"model", "config.json: model_type gpt2", conv + hf_config("cfg_type", "\"model_type\": \"llama\"", "\"model_type\": \"gpt2\""),
       "model_type"},
      {"model", "config.json: hidden_act gelu", conv + hf_config("cfg_act", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
       "hidden_act"},
      {"model", "config.json: heads not dividing", conv + hf_config("cfg_heads", "\"num_attention_heads\": 2", "\"num_attention_heads\": 3"),
       "cfg_heads"},
      {"model", "HF dir without weights", conv + [&] {
         const std::string d = hf_dir("hf_noweights", "");
         fs::remove(d + "/model.safetensors");
         return d;
       }(), "has config.json but neither model.safetensors nor"},
      {"model", "HF index naming a missing shard", conv + [&] {
         const std::string d = dir() + "/hf_shard";
         fs::remove_all(d);
         fs::copy(kFixtures + "/hf_tiny/sharded", d);
         fs::remove(d + "/model-00002-of-00002.safetensors");
         return d;
       }(), "which is missing from"},
      {"model", "HDF5 that is a dataset", conv + dataset(), "tales.h5"},
      {"model", "directory without config.json", conv + [&] {
         fs::create_directories(dir() + "/emptydir");
         return dir() + "/emptydir";
       }(), "a directory without config.json"},
      // ---- question/answer records (prepare --qa) ----
      {"qa", "missing", qa + dir() + "/absent.jsonl", "absent.jsonl"},
      {"qa", "empty", qa + file("q_empty.jsonl", ""), "empty; expected JSON lines"},
      {"qa", "bad JSON on line 2", qa + file("q_bad.jsonl", "{\"question\": \"a?\", \"context\": \"b\", \"answer\": \"yes\"}\n{\"question\": \n"),
       "q_bad.jsonl:2: not valid JSON"},
      {"qa", "answer missing", qa + file("q_noans.jsonl", "{\"question\": \"a?\", \"context\": \"b\"}\n"), "q_noans.jsonl:1:"},
      {"qa", "answer empty", qa + file("q_emptyans.jsonl", "{\"question\": \"a?\", \"context\": \"b\", \"answer\": \"\"}\n"),
       "q_emptyans.jsonl:1:"},
      {"qa", "answer a number", qa + file("q_num.jsonl", "{\"question\": \"a?\", \"context\": \"b\", \"answer\": 5}\n"),
       "q_num.jsonl:1:"},
      {"qa", "not UTF-8", qa + file("q_utf8.jsonl", "{\"question\": \"a\xff?\", \"context\": \"b\", \"answer\": \"yes\"}\n"),
       "q_utf8.jsonl:1:"},
      {"qa", "object over several lines", qa + file("q_multi.jsonl", "{\"question\": \"a?\",\n \"context\": \"b\", \"answer\": \"yes\"}\n"),
       "one JSON object spread over several lines"},
      {"qa", "plain text", qa + file("q_text.jsonl", "just some words\nand more\n"), "not JSON lines, a JSON array"},
      {"qa", "a JSON number", qa + file("q_number.json", "42\n"), "q_number.json"},
      {"qa", "array of strings", qa + file("q_strs.json", "[\"a\", \"b\"]\n"), "q_strs.json:[0]"},
      {"qa", "eval --task --qa bad", "eval --model " + dir() + "/tiny/model.h5 --task pubmedqa --qa " + dir() +
       "/q_bad.jsonl", "q_bad.jsonl:2: not valid JSON"},
      // ---- held-out ids and answer fields (prepare --test-ids, --answer-field; issue 35) ----
      {"qa", "--test-ids naming absent ids", qa + file("q_ids.jsonl", "{\"id\": \"a\", \"question\": \"a?\", \"answer\": \"yes\"}\n"
       "{\"id\": \"b\", \"question\": \"b?\", \"answer\": \"no\"}\n") + " --test-ids " + file("q_ids.json", "[\"a\", \"x1\", \"x2\"]"),
       "q_ids.json: 2 of the 3 listed ids are not among the 2 records read from " + dir() + "/q_ids.jsonl, e.g. 'x1', 'x2'"},
      {"qa", "--test-ids with --test-split", qa + dir() + "/q_ids.jsonl --test-ids " + dir() + "/q_ids.json --test-split 0.2",
       "and --test-split 0.2 both choose the test split; choose one"},
      {"qa", "eval --ids with a label that is not a string", "eval --model " + dir() + "/tiny/model.h5 --task pubmedqa --qa "
       "builtin:factqa --ids " + file("q_ids_num.json", "{\"factqa-1\": 1}"),
       "q_ids_num.json: the label of id 'factqa-1' is number, not a string (yes, no or maybe)"},
      {"qa", "--test-ids not an id list", qa + dir() + "/q_ids.jsonl --test-ids " + file("q_ids_bad.json", "[1.5]"),
       "q_ids_bad.json: element [0] is number, not an id (a string or an integer)"},
      {"qa", "--answer-field final_decision without a label", qa + dir() + "/q_ids.jsonl --answer-field final_decision",
       "q_ids.jsonl:1: no final_decision (yes, no or maybe) for --answer-field final_decision"},
      {"qa", "--output = --test-ids", qa.substr(0, qa.find("--output")) + "--output " + dir() + "/q_ids.json --qa " + dir() +
       "/q_ids.jsonl --test-ids " + dir() + "/q_ids.json", "--output " + dir() + "/q_ids.json: is the input --test-ids"},
      // ---- tokenizers (prepare/eval/generate/convert --tokenizer) ----
      {"tokenizer", "missing", tok + dir() + "/absent.model", "absent.model: tokenizer model not found"},
      {"tokenizer", "empty", tok + file("t_empty.model", ""), "not a SentencePiece model (empty)"},
      {"tokenizer", "garbage", tok + file("t_garbage.model", "this is not a protobuf at all"), "not a SentencePiece model"},
      {"tokenizer", "truncated", tok + file("t_trunc.model", testing::slurp(dir() + "/tales.model").substr(0, 100)),
       "t_trunc.model"},
      {"tokenizer", "generate --tokenizer garbage", "generate --model " + kFixtures + "/llama2c_tiny.bin --prompt hi --tokenizer " +
       dir() + "/t_garbage.model", "not a SentencePiece model"},
      {"tokenizer", "train --init-from .bin --tokenizer garbage", "train --init-from " + kFixtures + "/llama2c_tiny.bin --data " +
       dataset() + " --max-steps 1 --tokenizer " + dir() + "/t_garbage.model", "not a SentencePiece model"},
      // ---- metrics files (plan --calibrate) and calibration files (plan --calibration) ----
      {"metrics", "--calibrate not JSON lines", "plan --model-config tiny --seq-len 32 --calibrate " + file("x_metrics.jsonl", "{\"type\": \"step\"\nnope\n"),
       "x_metrics.jsonl:1"},
      {"metrics", "--calibration not JSON", "plan --model-config tiny --seq-len 32 --tokens 1000 --global-batch 8 --calibration " +
       file("x_cal.json", "{oops"), "x_cal.json: not JSON"},
      // ---- text (prepare --text, eval --text) ----
      {"text", "prepare --text missing", "prepare --text " + dir() + "/absent.txt --vocab-size 300 --seq-len 32 --output " + out + "/x.h5",
       "absent.txt"},
      {"text", "prepare --text empty", "prepare --text " + file("x_empty.txt", "") + " --vocab-size 300 --seq-len 32 --output " +
       out + "/x.h5", "x_empty.txt"},
      {"text", "eval --text missing", "eval --model " + dir() + "/tiny/model.h5 --text " + dir() + "/absent.txt --seq-len 8",
       "absent.txt"},
      {"text", "eval --text not UTF-8", "eval --model " + dir() + "/tiny/model.h5 --text " + file("x_latin1.txt", "caf\xe9\n") +
       " --seq-len 8", "x_latin1.txt: not valid UTF-8 at byte offset 3"},
      {"text", "generate --prompt not UTF-8", "generate --model " + dir() + "/tiny/model.h5 --prompt \"$(printf 'ab\\377')\"",
       "--prompt: not valid UTF-8 at byte offset 2"},
  };
  return c;
}

// Every numeric option of every subcommand: from its --help line ("--max-steps INT:>= 1",
// "--beta2 FLOAT:in [0, 1)"), values outside the range. The required options of each command
// are given so that the error can only be about the option under test.
struct Sub {
  std::string name, required;
};

std::vector<Case> option_cases() {
  const std::vector<Sub> subs = {
      {"train", "--data /nonexistent/d.h5"},
      {"prepare", "--text builtin:tinytales --output /nonexistent/d.h5"},
      {"eval", "--model /nonexistent/m.bin"},
      {"generate", "--model /nonexistent/m.bin"},
      {"convert", "--input /nonexistent/m.bin --output /nonexistent/o.h5"},
      {"plan", "--model-config tiny"},
      {"info", ""},
  };
  // "--zero INT:in [0, 2]=1", "--batch-size INT:>= 1=8", "--lr FLOAT:> 0=0.0003" (a default after '=').
  const std::string num = R"((-?[0-9][0-9.e+-]*))";
  const std::regex opt_re(R"((--[a-z0-9-]+) (INT|UINT|FLOAT):(?:(>=|>) )" + num + R"(|in ([\[(]))" + num + ", " + num +
                          R"(([\])])))");
  std::vector<Case> c;
  for (const Sub& s : subs) {
    const auto help = faults::run_tool(s.name + " --help", 60);
    EXPECT_EQ(help.status, 0) << s.name << " --help\n" << help.err;
    std::set<std::string> seen;
    for (std::sregex_iterator it(help.out.begin(), help.out.end(), opt_re), end; it != end; ++it) {
      const std::string opt = (*it)[1], kind = (*it)[2];
      if (!seen.insert(opt).second) continue;
      const bool integer = kind != "FLOAT";
      std::vector<std::string> bad;
      std::string range;
      if ((*it)[3].matched) {
        const std::string op = (*it)[3], lo = (*it)[4];
        range = op + " " + lo;
        if (integer) bad.push_back(std::to_string(std::stoll(lo) - 1));
        else bad.push_back(op == ">" ? lo : "-1");
      } else {
        const std::string open = (*it)[5], lo = (*it)[6], hi = (*it)[7], close = (*it)[8];
        range = "in " + open + lo + ", " + hi + close;
        if (integer) {
          bad.push_back(std::to_string(std::stoll(lo) - 1));
          bad.push_back(std::to_string(std::stoll(hi) + 1));
        } else {
          bad.push_back(open == "(" ? lo : "-1");
          bad.push_back(close == ")" ? hi : "2" + hi);
        }
      }
      bad.push_back(integer ? "1.5" : "nan");
      bad.push_back("x");
      for (const std::string& v : bad) {
        Case k;
        k.group = "option";
        k.name = s.name + " " + opt + " " + v;
        k.args = s.name + " " + s.required + " " + opt + " " + v;
        k.needle = "llamatrain " + s.name + ": error: " + opt + " " + v + ": expected " +
                   (integer ? "an integer " : "a number ") + range;
        c.push_back(k);
      }
    }
  }
  // Options that take a word or a list, and what no range can say.
  const std::string t = "train --data /nonexistent/d.h5 ";
  const std::string real = "train --vocab-size 300 --max-steps 1 --no-progress --data " + dataset() + " ";
  const std::vector<Case> more = {
      {"option", "train --device tpu", t + "--device tpu", "--device"},
      {"option", "train --recompute some", t + "--recompute some", "--recompute"},
      {"option", "train --balance fair", t + "--balance fair", "--balance"},
      {"option", "train --rank-weights 1,x", t + "--rank-weights 1,x --balance static", "--rank-weights"},
      {"option", "train --simulate-slowdown 5", t + "--simulate-slowdown 5", "--simulate-slowdown"},
      {"option", "train --min-lr above --lr", t + "--lr 1e-4 --min-lr 1e-3", "--min-lr 0.001 is above --lr 0.0001"},
      {"option", "train --max-steps with --epochs", t + "--max-steps 3 --epochs 2", "excludes"},
      {"option", "train --tokenizer without --init-from", t + "--tokenizer x.model", "--tokenizer"},
      {"option", "train --resume empty", real + "--resume ''", "--resume needs auto, none or a checkpoint directory"},
      {"option", "train --resume not a checkpoint", real + "--resume " + dir(), "not a checkpoint (no checkpoint.h5)"},
      {"option", "train unknown option", t + "--max-stepz 3", "--max-stepz"},
      {"option", "unknown subcommand", "trian --data x", "trian"},
      {"option", "eval --split dev", "eval --model m.bin --data d.h5 --split dev", "--split"},
      {"option", "eval --task squad", "eval --model m.bin --task squad", "--task"},
      {"option", "eval no input", "eval --model " + kFixtures + "/llama2c_tiny.bin", "eval"},
      {"option", "generate --prompt-type 7", "generate --model m.bin --prompt-type 7 --question q", "--prompt-type"},
      {"option", "generate --prompt-type ''", "generate --model m.bin --prompt-type '' --question Why",
       "--prompt-type : expected an integer in [1, 3]"},
      {"option", "plan --cpu-cores 2147483647", "plan --model-config tiny --seq-len 32 --cpu-cores 2147483647",
       "--cpu-cores 2147483647: expected an integer in [1, 1048576]"},
      {"option", "prepare --prompt-type 0", "prepare --qa builtin:factqa --prompt-type 0 --output /tmp/x.h5", "--prompt-type"},
      {"option", "prepare --text and --qa", "prepare --text a --qa b --output /tmp/x.h5", "excludes"},
      {"option", "prepare --tokenizer-type word", "prepare --text builtin:tinytales --tokenizer-type word --output /tmp/x.h5",
       "--tokenizer-type"},
      {"option", "prepare --answer-field label", "prepare --qa builtin:factqa --answer-field label --output /tmp/x.h5",
       "--answer-field"},
      {"option", "prepare --template without {answer}", "prepare --qa builtin:factqa --template 'Q: {question}' --seq-len 64 "
       "--output /tmp/x.h5", "--template: the template has no {answer}"},
      {"option", "prepare --template with an unknown placeholder", "prepare --qa builtin:factqa --template "
       "'{question} {system} {answer}' --seq-len 64 --output /tmp/x.h5", "unknown placeholder {system}"},
      {"option", "prepare --template and --prompt-type", "prepare --qa builtin:factqa --template llama2-chat --prompt-type 2 "
       "--seq-len 64 --output /tmp/x.h5", "excludes"},
      {"option", "prepare --system without llama2-chat", "prepare --qa builtin:factqa --prompt-type 2 --system hi --seq-len 64 "
       "--output /tmp/x.h5", "--system is for --template llama2-chat"},
      {"option", "prepare --template @absent", "prepare --qa builtin:factqa --template @" + dir() + "/absent.tmpl --seq-len 64 "
       "--output /tmp/x.h5", dir() + "/absent.tmpl"},
      {"option", "prepare --test-ids with --text", "prepare --text builtin:tinytales --test-ids ids.json --seq-len 64 "
       "--output /tmp/x.h5", "--test-ids is for --qa"},
      {"option", "eval --template without {question}", "eval --model " + dir() + "/tiny/model.h5 --task pubmedqa --qa builtin:factqa "
       "--template 'C: {context} A: {answer}'", "--template: the template has no {question} before {answer}"},
      {"option", "eval --template with a mistyped name", "eval --model m.bin --task pubmedqa --template llama-chat",
       "--template 'llama-chat': no such format; the names are llama2-chat, alpaca, qa-inline-markers, qa-section-markers"},
      {"option", "eval --answer-field label", "eval --model m.bin --task pubmedqa --answer-field label", "--answer-field"},
      {"option", "generate --system without llama2-chat", "generate --model " + dir() + "/tiny/model.h5 --prompt-type 1 "
       "--question q --system hi", "--system is for --template llama2-chat"},
      {"option", "generate --question without a format", "generate --model " + dir() + "/tiny/model.h5 --question q",
       "--question and --context need --prompt-type or --template"},
      {"option", "convert --to onnx", "convert --input m.bin --output o --to onnx", "--to"},
      {"option", "convert --dtype f8", "convert --input m.bin --output o/ --dtype f8", "--dtype"},
      {"option", "convert --max-shard-size 5XB", "convert --input m.bin --output o/ --max-shard-size 5XB", "--max-shard-size"},
      {"option", "plan --model-config nope", "plan --model-config nope --tokens 1000 --global-batch 8", "nope"},
      {"option", "train --model-config nope", real + "--model-config nope", "unknown model config 'nope'"},
      {"option", "LLAMATRAIN_MEMORY_LIMIT=12Q", "prepare --text builtin:tinytales --seq-len 32 --output /tmp/x.h5",
       "LLAMATRAIN_MEMORY_LIMIT=12Q: expected a number of bytes"},
  };
  c.insert(c.end(), more.begin(), more.end());
  return c;
}

TEST(FaultsTable, EveryParserAndOptionRefusesBadInputClearly) {
  ASSERT_FALSE(dataset().empty());
  // A tiny model for the dataset case "a model file, not a dataset", and one with the dataset's
  // tokenizer for the eval and generate cases.
  {
    auto r = faults::run_tool("convert --input " + kFixtures + "/llama2c_tiny.bin --output " + dir() + "/model.h5");
    ASSERT_EQ(r.status, 0) << r.err;
    r = faults::run_tool("train --model-config tiny --vocab-size 300 --data " + dataset() +
                         " --max-steps 1 --batch-size 2 --no-progress --output " + dir() + "/tiny");
    ASSERT_EQ(r.status, 0) << r.err;
    r = faults::run_tool("train --model-config tiny --vocab-size 300 --data " + dataset() +
                         " --max-steps 1 --batch-size 2 --no-progress --max-seq-len 2147483647 --output " + dir() +
                         "/long");
    ASSERT_EQ(r.status, 0) << r.err;
  }
  std::vector<Case> table = file_cases();
  const std::vector<Case> options = option_cases();
  table.insert(table.end(), options.begin(), options.end());
  // A few at a time: most of each case is process start-up.
  std::vector<faults::Run> runs(table.size());
  constexpr size_t kParallel = 4;
  for (size_t i = 0; i < table.size(); i += kParallel) {
    std::vector<std::future<faults::Run>> batch;
    for (size_t j = i; j < std::min(table.size(), i + kParallel); ++j) {
      std::string cmd = "'" + std::string(LLAMATRAIN_BINARY) + "' " + table[j].args;
      if (table[j].name.rfind("LLAMATRAIN_MEMORY_LIMIT", 0) == 0) cmd = "env LLAMATRAIN_MEMORY_LIMIT=12Q " + cmd;
      batch.push_back(std::async(std::launch::async, [cmd] { return faults::run_limited(cmd, 60); }));
    }
    for (size_t j = 0; j < batch.size(); ++j) runs[i + j] = batch[j].get();
  }
  std::map<std::string, int> per_group;
  for (size_t i = 0; i < table.size(); ++i) {
    const Case& c = table[i];
    SCOPED_TRACE(c.group + ": " + c.name + "\n  llamatrain " + c.args);
    const Outcome o = faults::expect_refusal(c.group + ": " + c.name, runs[i], c.status, c.needle);
    ++per_group[c.group];
    if (o != Outcome::kClear)
      std::printf("%-9s %-45s %s\n  llamatrain %s\n  %s\n", c.group.c_str(), c.name.c_str(), faults::outcome_name(o),
                  c.args.c_str(), faults::last_line(runs[i].err).c_str());
  }
  std::string counts;
  for (const auto& [g, n] : per_group) counts += " " + g + " " + std::to_string(n);
  std::printf("%zu bad-input cases:%s\n", table.size(), counts.c_str());
}

}  // namespace
}  // namespace lt
