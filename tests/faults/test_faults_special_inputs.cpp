// Inputs that used to crash, hang or be destroyed (issue 37, items 1, 2 and 4): an output naming an
// input (the input was truncated, exit 0), JSON nested deeper than any real
// file (a stack overflow when the value was walked or printed), and FIFOs or character devices
// given where a file is read (an open that blocks until a writer comes, or /dev/zero read for
// ever). Each must be refused at once with exit status 1, naming the file (and for JSON the line,
// column and depth); the fault suite counts every case (tests/faults/fault_cases.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "faults/fault_cases.h"
#include "test_util.h"

namespace lt {
namespace special_inputs {  // named: the fault tests are built as unity files beside each other's helpers

namespace fs = std::filesystem;
using testing::scratch;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

// A `tiny` model trained for one step on the faults' stories (its tokenizer inside); read only.
const std::string& tiny_model() {
  static const std::string path = testing::shared_fixture("faults-tiny-model", [](const std::string& dir) {
    const auto r = testing::run_cli("train --model-config tiny --vocab-size 300 --data " + faults::tales_v300_s32() +
                                    "/tales.h5 --max-steps 1 --batch-size 2 --output " + dir, 2);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0;
  }) + "/model.h5";
  return path;
}

std::string slurp_or_empty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(FaultsSpecialInput, AnOutputThatNamesAnInputIsRefusedAndTheInputKept) {
  const std::string d = scratch() + "/overwrite";
  fs::remove_all(d);
  fs::create_directories(d);
  // Copies: a refusal that failed must destroy nothing shared.
  fs::copy_file(faults::tales_v300_s32() + "/tales.h5", d + "/data.h5");
  fs::copy_file(faults::tales_v300_s32() + "/tales.model", d + "/tok.model");
  fs::copy_file(tiny_model(), d + "/model.h5");
  write_bytes(d + "/in.txt", "Once upon a time there was a cat. It sat on a mat.\n");
  write_bytes(d + "/q.jsonl", R"({"question": "Is it?", "context": "It is.", "answer": "yes"})" "\n");
  write_bytes(d + "/d.model", "Once upon a time a text file was named like a tokenizer.\n");
  fs::create_symlink(d + "/data.h5", d + "/link.jsonl");
  write_bytes(d + "/c.toml", "[train]\nmax-steps = 1\n");
  struct Case {
    std::string name, args, needle, input;
  };
  const std::string same = "(the same file); writing it would destroy the input";
  const std::vector<Case> cases = {
      {"train --metrics = --data", "train --model-config tiny --data " + d + "/data.h5 --max-steps 1 --metrics " + d + "/data.h5",
       "--metrics " + d + "/data.h5: is the input --data " + d + "/data.h5 " + same, d + "/data.h5"},
      {"train --metrics = --data through a link", "train --model-config tiny --data " + d + "/data.h5 --max-steps 1 --metrics " + d + "/link.jsonl",
       "--metrics " + d + "/link.jsonl: is the input --data", d + "/data.h5"},
      {"train --metrics = --init-from", "train --init-from " + d + "/model.h5 --data " + d + "/data.h5 --max-steps 1 --metrics " + d + "/model.h5",
       "is the input --init-from " + d + "/model.h5 " + same, d + "/model.h5"},
      {"train --output holding --init-from", "train --init-from " + d + "/model.h5 --data " + d + "/data.h5 --max-steps 1 --output " + d,
       "--output (its model.h5) " + d + "/model.h5: is the input --init-from", d + "/model.h5"},
      {"prepare --output = --text", "prepare --text " + d + "/in.txt --seq-len 16 --vocab-size 300 --output " + d + "/in.txt",
       "--output " + d + "/in.txt: is the input --text", d + "/in.txt"},
      {"prepare --output = --qa", "prepare --qa " + d + "/q.jsonl --seq-len 16 --tokenizer " + d + "/tok.model --output " + d + "/q.jsonl",
       "--output " + d + "/q.jsonl: is the input --qa", d + "/q.jsonl"},
      {"prepare --output = --tokenizer", "prepare --text " + d + "/in.txt --seq-len 16 --tokenizer " + d + "/tok.model --output " + d + "/tok.model",
       "--output " + d + "/tok.model: is the input --tokenizer", d + "/tok.model"},
      {"prepare: the trained tokenizer beside --output = --text", "prepare --text " + d + "/d.model --seq-len 16 --vocab-size 300 --output " + d + "/d.h5",
       "--output (the tokenizer trained beside it) " + d + "/d.model: is the input --text", d + "/d.model"},
      {"convert --output = --tokenizer", "convert --input " + d + "/model.h5 --tokenizer " + d + "/tok.model --to hdf5 --output " + d + "/tok.model",
       "--output " + d + "/tok.model: is the input --tokenizer", d + "/tok.model"},
      {"train --metrics = --config", "--config " + d + "/c.toml train --model-config tiny --data " + d + "/data.h5 --metrics " + d + "/c.toml",
       "--metrics " + d + "/c.toml: is the input --config", d + "/c.toml"},
      {"convert --output = --input", "convert --input " + d + "/model.h5 --to hdf5 --output " + d + "/model.h5",
       "--output " + d + "/model.h5: is the input --input", d + "/model.h5"},
  };
  for (const Case& c : cases) {
    const std::string before = slurp_or_empty(c.input);
    ASSERT_FALSE(before.empty()) << c.input;
    const faults::Run r = faults::run_tool(c.args, 60);
    faults::expect_refusal(c.name, r, 1, c.needle);
    EXPECT_EQ(slurp_or_empty(c.input), before) << c.name << ": the input " << c.input << " changed";
  }
  std::printf("%zu outputs naming an input refused, every input byte-identical after\n", cases.size());
}

TEST(FaultsSpecialInput, DeepJsonIsRefusedWithItsFileLineAndColumn) {
  const std::string d = scratch() + "/deep";
  fs::create_directories(d);
  const std::string good = R"({"question": "Is it?", "context": "It is.", "answer": "yes", "id": "1"})";
  // The crash of the campaign: a deep value beside a field with an invalid UTF-8 byte (the
  // record's UTF-8 check walked the value recursively).
  write_bytes(d + "/deep.jsonl", good + "\n" + R"({"question": "q", "context": "c", "answer": "yes", "x": )" +
                                     nested(100000) + ", \"z\": \"\xff\"}\n");
  write_bytes(d + "/deep.json", "[\n  " + good + ",\n  " + nested(300) + "\n]\n");
  write_bytes(d + "/ids.json", nested(100000));
  write_bytes(d + "/ok.jsonl", good + "\n");
  fs::create_directories(d + "/hf");
  write_bytes(d + "/hf/config.json", "{\"a\": " + nested(5000) + "}");
  write_bytes(d + "/metrics.jsonl", "{\"type\": " + nested(100000) + "}\n");
  struct Case {
    std::string name, args, needle;
  };
  const std::vector<Case> cases = {
      {"prepare --qa: a JSONL line 100,000 levels deep", "prepare --qa " + d + "/deep.jsonl --seq-len 64 --output " + d + "/o1.h5",
       d + "/deep.jsonl:2: JSON nests deeper than 256 levels (arrays and objects) at byte 312"},
      {"prepare --qa: a JSON array with an element 300 levels deep", "prepare --qa " + d + "/deep.json --seq-len 64 --output " + d + "/o2.h5",
       d + "/deep.json:3: JSON nests deeper than 256 levels (arrays and objects) at byte 258"},
      {"eval --ids: 100,000 levels", "eval --task pubmedqa --model " + tiny_model() + " --qa " + d + "/ok.jsonl --ids " + d + "/ids.json",
       d + "/ids.json:1:257: JSON nests deeper than 256 levels"},
      {"convert: a config.json 5,000 levels deep", "convert --input " + d + "/hf --output " + d + "/m.bin",
       d + "/hf/config.json:1:262: JSON nests deeper than 256 levels"},
      {"plan --calibrate: a metrics line 100,000 levels deep", "plan --model-config tiny --seq-len 64 --calibrate " + d + "/metrics.jsonl",
       d + "/metrics.jsonl:1:265: JSON nests deeper than 256 levels"},
  };
  for (const Case& c : cases) {
    const faults::Run r = faults::run_tool(c.args, 60);
    faults::expect_refusal(c.name, r, 1, c.needle);
    for (const char* out : {"/o1.h5", "/o2.h5", "/m.bin"}) EXPECT_FALSE(fs::exists(d + out)) << c.name << ": " << out;
  }
  std::printf("%zu deeply nested JSON inputs refused with file, line and column\n", cases.size());
}

TEST(FaultsSpecialInput, FifosAndDevicesAreRefusedWhereAFileIsRead) {
  const std::string d = scratch() + "/special";
  fs::create_directories(d);
  const std::string fifo = d + "/pipe";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string data = faults::tales_v300_s32() + "/tales.h5";
  struct Case {
    std::string name, args, needle;
  };
  std::vector<Case> cases;
  for (const std::string& special : {fifo, std::string("/dev/zero")}) {
    const std::string kind =
        special == fifo ? "is a FIFO (named pipe; bash's <(...) makes one: write the text to a file), not a regular file"
                        : "is a character device, not a regular file";
    const std::string in = special == fifo ? "FIFO" : "/dev/zero";
    cases.push_back({"train --init-from " + in, "train --init-from " + special + " --data " + data + " --max-steps 1",
                     special + ": model file " + kind});
    cases.push_back({"generate --model " + in, "generate --model " + special + " --prompt hi", special + ": model file " + kind});
    cases.push_back({"train --data " + in, "train --model-config tiny --data " + special + " --max-steps 1",
                     special + ": HDF5 file " + kind});
    cases.push_back({"prepare --text " + in, "prepare --text " + special + " --seq-len 32 --output " + d + "/o.h5",
                     special + ": text file " + kind});
    cases.push_back({"prepare --qa " + in, "prepare --qa " + special + " --seq-len 32 --output " + d + "/o.h5",
                     special + ": input " + kind});
    cases.push_back({"prepare --tokenizer " + in,
                     "prepare --text builtin:tinytales --tokenizer " + special + " --seq-len 32 --output " + d + "/o.h5",
                     special + ": tokenizer model " + kind});
    cases.push_back({"plan --hostfile " + in, "plan --model-config tiny --seq-len 64 --hostfile " + special, special + ": input " + kind});
    cases.push_back({"--config " + in, "--config " + special + " plan --model-config tiny --seq-len 64",
                     special + ": config file (--config) " + kind});
    cases.push_back({"eval --ids " + in,
                     "eval --task pubmedqa --model " + tiny_model() + " --qa " + special + " --ids " + special,
                     special + ": input " + kind});
  }
  for (const Case& c : cases) {
    const faults::Run r = faults::run_tool(c.args, 30);
    faults::expect_refusal(c.name, r, 1, c.needle);
    EXPECT_LT(r.seconds, 20.0) << c.name;
  }
  std::printf("%zu FIFO and character-device inputs refused at once\n", cases.size());
}

}  // namespace special_inputs
}  // namespace lt
