// Options and config files are checked before any work (issue 14): every numeric option's range
// stated in --help and enforced with one message form, config files checked line by line,
// misspelled commands and options answered with the nearest name, parse errors on one line with
// status 1, output directories checked writable at the start (on every rank), GPU names through
// one lookup, and `info` saying which backends were linked.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/ranges.h"
#include "cli/suggest.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/hostfile.h"
#include "test_util.h"

namespace lt {
namespace {

using testing::run_cli;

struct BadArgs {
  std::string args;     // after `llamatrain`
  std::string message;  // the whole of stderr
};

// A dataset path that does not exist: had an option slipped through, the error would be about it.
const std::string kAbsent = "/nonexistent/llamatrain-test/data.h5";

void expect_refused(const std::vector<BadArgs>& cases) {
  for (const auto& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.err, c.message + "\n") << c.args;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

TEST(CliOptions, OutOfRangeValuesAreRefusedBeforeAnyWork) {
  const std::string train = "train --data " + kAbsent + " ";
  const std::string e = "llamatrain train: error: ";
  expect_refused({
      {train + "--max-steps 0", e + "--max-steps 0: expected an integer >= 1"},
      {train + "--max-steps -1", e + "--max-steps -1: expected an integer >= 1"},
      {train + "--max-steps 1.5", e + "--max-steps 1.5: expected an integer >= 1"},
      {train + "--max-steps ten", e + "--max-steps ten: expected an integer >= 1"},
      {train + "--epochs 0", e + "--epochs 0: expected an integer >= 1"},
      {train + "--lr 0", e + "--lr 0: expected a number > 0"},
      {train + "--lr nan", e + "--lr nan: expected a number > 0"},
      {train + "--lr inf", e + "--lr inf: expected a number > 0"},
      {train + "--min-lr -1e-5", e + "--min-lr -1e-5: expected a number >= 0"},
      {train + "--warmup-steps -5", e + "--warmup-steps -5: expected an integer >= 0"},
      {train + "--grad-clip nan", e + "--grad-clip nan: expected a number >= 0"},
      {train + "--grad-clip -1", e + "--grad-clip -1: expected a number >= 0"},
      {train + "--beta1 1", e + "--beta1 1: expected a number in [0, 1)"},
      {train + "--beta2 -0.1", e + "--beta2 -0.1: expected a number in [0, 1)"},
      {train + "--adam-eps 0", e + "--adam-eps 0: expected a number > 0"},
      {train + "--weight-decay -0.1", e + "--weight-decay -0.1: expected a number >= 0"},
      {train + "--global-batch 0", e + "--global-batch 0: expected an integer >= 1"},
      {train + "--batch-size 0", e + "--batch-size 0: expected an integer >= 1"},
      {train + "--batch-size 3000000000", e + "--batch-size 3000000000: expected an integer >= 1 and <= 2147483647"},
      {train + "--grad-accum 0", e + "--grad-accum 0: expected an integer >= 1"},
      {train + "--dim 0", e + "--dim 0: expected an integer >= 1"},
      {train + "--hidden-dim -4", e + "--hidden-dim -4: expected an integer >= 1"},
      {train + "--n-layers 0", e + "--n-layers 0: expected an integer in [1, 4096]"},
      {train + "--n-layers 2147483647", e + "--n-layers 2147483647: expected an integer in [1, 4096]"},
      {train + "--n-heads 0", e + "--n-heads 0: expected an integer >= 1"},
      {train + "--n-kv-heads 0", e + "--n-kv-heads 0: expected an integer >= 1"},
      {train + "--vocab-size 0", e + "--vocab-size 0: expected an integer >= 1"},
      {train + "--max-seq-len 0", e + "--max-seq-len 0: expected an integer >= 1"},
      {train + "--keep-last -1", e + "--keep-last -1: expected an integer >= 0"},
      {train + "--checkpoint-every -1", e + "--checkpoint-every -1: expected an integer >= 0"},
      {train + "--zero 4", e + "--zero 4: expected an integer in [0, 3]"},
      {train + "--rebalance-every 0", e + "--rebalance-every 0: expected an integer >= 1"},
      {train + "--comm-timeout 0.5", e + "--comm-timeout 0.5: expected a number in [1, 86400]"},
      {train + "--comm-timeout nan", e + "--comm-timeout nan: expected a number in [1, 86400]"},
      {train + "--seed -1", e + "--seed -1: expected an integer >= 0"},
      {train + "--balance even", e + "--balance: even not in {off,static,auto}"},
      {train + "--lr 1e-3 --min-lr 2e-3",
       e + "--min-lr 0.002 is above --lr 0.001; the cosine schedule decays from --lr down to --min-lr"},
      {train + "--keep-best --output /nonexistent/llamatrain-test/out",
       e + "--keep-best needs --eval-every N: it keeps the state of the lowest of those test losses"},
      {train + "--keep-best --eval-every 5",
       e + "--keep-best needs --checkpoint-dir DIR or --output DIR: where the best state is kept"},
  });
}

TEST(CliOptions, OutOfRangeValuesOfTheOtherCommands) {
  const std::string model = " --model /nonexistent/m.h5";
  expect_refused({
      {"generate" + model + " --temperature nan",
       "llamatrain generate: error: --temperature nan: expected a number >= 0"},
      {"generate" + model + " --temperature -1",
       "llamatrain generate: error: --temperature -1: expected a number >= 0"},
      {"generate" + model + " --top-p 0", "llamatrain generate: error: --top-p 0: expected a number in (0, 1]"},
      {"generate" + model + " --top-p 1.5", "llamatrain generate: error: --top-p 1.5: expected a number in (0, 1]"},
      {"generate" + model + " --top-p nan", "llamatrain generate: error: --top-p nan: expected a number in (0, 1]"},
      {"generate" + model + " --max-new-tokens 0",
       "llamatrain generate: error: --max-new-tokens 0: expected an integer >= 1"},
      {"eval" + model + " --batch-size 0", "llamatrain eval: error: --batch-size 0: expected an integer >= 1"},
      {"eval" + model + " --seq-len 0", "llamatrain eval: error: --seq-len 0: expected an integer >= 1"},
      {"prepare --text x.txt --output /nonexistent/o.h5 --seq-len 0",
       "llamatrain prepare: error: --seq-len 0: expected an integer >= 1"},
      {"prepare --text x.txt --output /nonexistent/o.h5 --seq-len 8 --test-split 1",
       "llamatrain prepare: error: --test-split 1: expected a number in [0, 1)"},
      {"prepare --text x.txt --output /nonexistent/o.h5 --seq-len 8 --test-split -0.1",
       "llamatrain prepare: error: --test-split -0.1: expected a number in [0, 1)"},
      {"prepare --text x.txt --output /nonexistent/o.h5 --seq-len 8 --vocab-size 100",
       "llamatrain prepare: error: --vocab-size 100: expected an integer >= 260"},
      {"prepare --text x.txt --output /nonexistent/o.h5 --seq-len 8 --min-answer-tokens -1",
       "llamatrain prepare: error: --min-answer-tokens -1: expected an integer >= 0"},
      {"prepare --qa builtin:factqa --output /nonexistent/o.h5 --seq-len 128 --decision-weight 0",
       "llamatrain prepare: error: --decision-weight 0: expected an integer in [1, 255]"},
      {"prepare --qa builtin:factqa --output /nonexistent/o.h5 --seq-len 128 --decision-weight 5",
       "llamatrain prepare: error: --decision-weight 5 needs answers that end with their decision: --answer-field both "
       "or final_decision"},
      {"plan --model-config tiny --global-batch 0",
       "llamatrain plan: error: --global-batch 0: expected an integer >= 1"},
      {"plan --model-config tiny --np 0", "llamatrain plan: error: --np 0: expected an integer >= 1"},
      {"plan --model-config tiny --cpu-cores 0", "llamatrain plan: error: --cpu-cores 0: expected an integer in [1, 1048576]"},
      {"plan --model-config tiny --zero 5", "llamatrain plan: error: --zero 5: expected an integer in [0, 3]"},
      {"plan --model-config tiny --tokens 0", "llamatrain plan: error: --tokens 0: expected an integer >= 1"},
      {"plan --model-config tiny --seq-len -8", "llamatrain plan: error: --seq-len -8: expected an integer >= 1"},
      {"plan --model-config tiny --n-layers 0", "llamatrain plan: error: --n-layers 0: expected an integer in [1, 4096]"},
      {"plan --model-config tiny --n-layers 2147483647",
       "llamatrain plan: error: --n-layers 2147483647: expected an integer in [1, 4096]"},
      {"plan --model-config tiny --batch-size 0", "llamatrain plan: error: --batch-size 0: expected an integer >= 1"},
      {"plan --model-config tiny --recompute most",
       "llamatrain plan: error: --recompute: most not in {none,attn,full}"},
      {"plan --model-config tiny --grad-reduce-dtype fp16",
       "llamatrain plan: error: --grad-reduce-dtype: fp16 not in {fp32,bf16}"},
      {"eval" + model + " --precision fp16", "llamatrain eval: error: --precision: fp16 not in {fp32,bf16}"},
      {"generate" + model + " --precision fp16", "llamatrain generate: error: --precision: fp16 not in {fp32,bf16}"},
      {"plan --model-config tiny --seq-len 100000 --global-batch 8 --tokens 1000000",
       "llamatrain plan: error: --seq-len 100000 exceeds the max_seq_len 128 of --model-config tiny (train refuses "
       "such "
       "data)"},
      {"convert --input /nonexistent/m.bin --output /nonexistent/o.h5 --max-shard-size 0",
       "llamatrain convert: error: --max-shard-size 0: expected an integer >= 1"},
  });
}

// Every option that takes a number says its range in --help (CLI11 shows a validator's
// description after the type: `--max-steps INT:>= 1`).
TEST(CliOptions, HelpStatesTheRangeOfEveryNumericOption) {
  CLI::App app{"test"};
  cli::InfoOptions info;
  cli::PrepareOptions prepare;
  cli::TrainCliOptions train;
  cli::EvalOptions eval;
  cli::GenerateOptions generate;
  cli::ConvertOptions convert;
  cli::PlanCliOptions plan;
  const std::vector<CLI::App*> subs = {cli::setup_info(app, info),         cli::setup_prepare(app, prepare),
                                       cli::setup_train(app, train),       cli::setup_eval(app, eval),
                                       cli::setup_generate(app, generate), cli::setup_convert(app, convert),
                                       cli::setup_plan(app, plan)};
  int numeric = 0;
  for (CLI::App* sub : subs)
    for (const CLI::Option* op : sub->get_options()) {
      const std::string type = op->get_type_name();
      const std::string base = type.substr(0, type.find(':'));
      if (base != "INT" && base != "UINT" && base != "FLOAT") continue;
      ++numeric;
      EXPECT_NE(type.find(':'), std::string::npos) << sub->get_name() << " " << op->get_name() << ": " << type;
    }
  EXPECT_GE(numeric, 45);
  const auto r = run_cli("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--max-steps INT:>= 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--beta2 FLOAT:in [0, 1)"), std::string::npos) << r.out;
}

// A real option is checked as its variable's type holds the value (add_real deduces float or
// double), and in_range, which cannot see that type, refuses a real range when the option is set up.
TEST(CliOptions, RealOptionsAreCheckedAsTheTypeOfTheirVariable) {
  CLI::App app{"test"};
  float f = 0.5f;
  double d = 0.5;
  cli::add_real(&app, "--f", f, "a float", cli::reals_in(0, 1, "[)"));
  cli::add_real(&app, "--d", d, "a double", cli::reals_in(0, 1, "[)"));
  app.parse(std::vector<std::string>{"0.99999999999", "--d", "0.99999994", "--f"});  // last-first
  EXPECT_EQ(d, 0.99999999999);
  EXPECT_EQ(f, 0.99999994f);
  auto refusal = [&](std::vector<std::string> args) {
    try {
      app.parse(args);
    } catch (const cli::OptionError& e) {
      return e.what() + std::string(" | ") + e.expected();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal({"0.99999999999", "--f"}),
            "--f 0.99999999999: expected a number in [0, 1) that a 32-bit float holds | a number in [0, 1) that a "
            "32-bit float holds");
  EXPECT_EQ(refusal({"0.99999999999999999", "--d"}),
            "--d 0.99999999999999999: expected a number in [0, 1) that a 64-bit float holds | a number in [0, 1) "
            "that a 64-bit float holds");
  EXPECT_EQ(refusal({"1e-50", "--f"}), "--f 1e-50: expected a number in [0, 1) that a 32-bit float holds | a number "
                                       "in [0, 1) that a 32-bit float holds");
  EXPECT_EQ(refusal({"1e-50", "--d"}), "accepted");  // a double holds it
  EXPECT_EQ(refusal({"1.5", "--f"}), "--f 1.5: expected a number in [0, 1) | a number in [0, 1)");
  EXPECT_THROW(cli::in_range(app.add_option("--x", d), cli::reals_from(0)), std::logic_error);
  int n = 0;
  EXPECT_NO_THROW(cli::in_range(app.add_option("--n", n), cli::ints_from(0)));  // integer ranges: as before
}

// ---- config files -------------------------------------------------------------------------

TEST(CliConfig, ErrorsNameTheFileLineAndKeyWithASuggestion) {
  const std::string path = testing::scratch_dir().string() + "/run.toml";
  const std::string at = "llamatrain train: error: " + path + ":";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[train]\nmax_stepz = 3\n", at + "2: unknown key 'max_stepz' in [train]; did you mean 'max-steps'?"},
      {"# run\n[trian]\nmax-steps = 3\n",
       at + "2: unknown section [trian]; did you mean 'train'? (sections are commands: info, prepare, train, eval, "
            "generate, convert, plan)"},
      {"[train]\nmax-steps = \"10\"\n", at + "2: max-steps = \"10\": expected a number, found a string"},
      {"[train]\nmax-steps = 0\n", at + "2: max-steps = 0: expected an integer >= 1"},
      {"[train]\nlr = nan\n", at + "2: lr = nan: expected a number > 0"},
      {"[train]\nbeta1 = 1.0  # too high\n", at + "2: beta1 = 1.0: expected a number in [0, 1)"},
      {"[train]\nmodel-config = 7\n", at + "2: model-config = 7: expected a string (in quotes), found a number"},
      {"[train]\nmodel-config = tiny\n",
       at + "2: model-config = tiny: not a number, true/false or a quoted string (a string needs quotes: \"tiny\")"},
      {"[train]\nno-progress = 1\n", at + "2: no-progress = 1: expected true or false, found a number"},
      {"[train]\ndevice = \"gpu\"\n", at + "2: device = \"gpu\": --device: gpu not in {auto,cpu,cuda,cuda-sim}"},
      {"[train]\nlr = [1, 2]\n", at + "2: lr = [1, 2]: expected one value, not an array"},
      {"max-steps = 3\n[train]\n",
       at + "1: max-steps is outside a section; options go under their command, e.g. [train]"},
      {"[train\n", at + "1: expected ']' after the section name"},
      {"[train.x]\n", at + "1: nested sections are not supported; expected [command], e.g. [train]"},
      {"[train]\nmax-steps 3\n", at + "2: expected '=' after max-steps"},
      {"[train]\nname = \"open\n", at + "2: name = unterminated string: name = \"open"},
      {"[train]\nmax_steps = 3\nmax-steps = 4\n", at + "3: max-steps given twice in [train] (first on line 2)"},
      {"[train]\n[train]\n", at + "2: section [train] given twice (first on line 1)"},
      {"[eval]\nbatch_size = 0\n", at + "2: batch_size = 0: expected an integer >= 1"},
      {"[train]\nmax-steps = 3 4\n", at + "2: unexpected text after the value: 4"},
  };
  for (const auto& [text, message] : cases) {
    write_file_atomic(path, text);
    const auto r = run_cli("--config " + path + " train --data " + kAbsent);
    EXPECT_EQ(r.status, 1) << text;
    EXPECT_EQ(r.err, message + "\n") << text;
  }
  const auto missing = run_cli("--config " + path + ".absent train --data " + kAbsent);
  EXPECT_EQ(missing.err, "llamatrain train: error: " + path + ".absent: config file not found (--config)\n");
}

// The file's values reach the options ('_' as '-', flags, arrays, sizes), the command line wins,
// and both spellings of --config work.
TEST(CliConfig, ValuesApplyAndTheCommandLineWins) {
  const std::string path = testing::scratch_dir().string() + "/run.toml";
  write_file_atomic(path,
                    "# a run\n[plan]\nmodel_config = 'tiny'  # literal string\ntokens = 1_000_000\n"
                    "seq-len = 64\nglobal_batch = 8\njson = true\n\n[train]\nmax_steps = 7\nno-shuffle = true\n"
                    "lr = 1e-3\n[convert]\nmax-shard-size = \"2GB\"\n[plan]\n");
  // The last line repeats [plan]: refused, so drop it for the runs below.
  EXPECT_NE(run_cli("--config " + path + " plan").err.find("section [plan] given twice"), std::string::npos);
  write_file_atomic(path, read_file_bytes(path).substr(0, read_file_bytes(path).size() - 7));
  auto a = run_cli("--config " + path + " plan");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.out.find("\"global_batch\": 8"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("\"seq_len\": 64"), std::string::npos) << a.out;
  auto b = run_cli("plan --config=" + path + " --global-batch 16");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.out.find("\"global_batch\": 16"), std::string::npos) << b.out;

  // In process: the values CLI11 stores from the file through our reader.
  CLI::App app{"test"};
  app.set_config("--config");
  app.config_formatter(std::make_shared<cli::ConfigReader>());
  cli::TrainCliOptions train;
  cli::ConvertOptions convert;
  cli::PlanCliOptions plan;
  cli::setup_train(app, train);
  cli::setup_convert(app, convert);
  cli::setup_plan(app, plan);
  cli::check_config(cli::read_config_file(path), app);
  app.parse(std::vector<std::string>{"0.01", "--lr", "d.h5", "--data", "train", path, "--config"});  // last-first
  EXPECT_EQ(train.train.max_steps, 7);
  EXPECT_FALSE(train.train.shuffle);
  EXPECT_FLOAT_EQ(train.train.lr, 0.01f);
  EXPECT_EQ(convert.max_shard_size, 2'000'000'000ull);
}

// ---- the command line ---------------------------------------------------------------------

TEST(CliArguments, MisspelledCommandsAndOptionsGetTheNearestName) {
  expect_refused({
      {"trian", "llamatrain: error: unknown command 'trian'; did you mean 'train'?"},
      {"--config x.toml prepar", "llamatrain: error: unknown command 'prepar'; did you mean 'prepare'?"},
      {"xyzzy",
       "llamatrain: error: unknown command 'xyzzy'; the commands are info, prepare, train, eval, generate, convert, "
       "plan"},
      {"",
       "llamatrain: error: a command is required: info, prepare, train, eval, generate, convert, plan "
       "(llamatrain --help)"},
      {"train --data " + kAbsent + " --max-stepz 3",
       "llamatrain train: error: unknown option --max-stepz; did you mean --max-steps?"},
      {"train --data " + kAbsent + " --lr=0.1 --warmup=3",
       "llamatrain train: error: unknown option --warmup; did you mean --warmup-steps?"},
      {"train", "llamatrain train: error: --data is required"},
      {"train --data " + kAbsent + " --epochs 2 --max-steps 3",
       "llamatrain train: error: --epochs excludes --max-steps"},
  });
  for (const std::string args : {"--help", "train --help", "plan --help", "--version"}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << args;
  }
}

TEST(CliArguments, NearestNameNeedsCloseEnoughSpelling) {
  EXPECT_EQ(cli::edit_distance("trian", "train"), 2);
  EXPECT_EQ(cli::edit_distance("", "abc"), 3);
  EXPECT_EQ(cli::edit_distance("max_steps", "max-steps"), 1);
  EXPECT_EQ(cli::nearest_name("evl", {"eval", "plan"}), "eval");
  EXPECT_EQ(cli::nearest_name("xyzzy", {"info", "train"}), "");
}

// A warm-up longer than the run is allowed (a deliberate schedule) but said.
TEST(CliOptions, WarmupLongerThanTheRunIsAWarning) {
  const auto r = run_cli("train --data " + kAbsent + " --max-steps 10 --warmup-steps 50");
  EXPECT_NE(r.err.find("train: warning: --warmup-steps 50 is longer than the run (--max-steps 10); the learning rate "
                       "never reaches --lr\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(kAbsent), std::string::npos) << "the run went on to the data: " << r.err;
}

// A small --lr under the default --min-lr is pointed out, not refused (runs such as
// scripts/gpu-check.sh's --lr 1e-5 train as before); a given --min-lr above --lr is refused.
TEST(CliOptions, DefaultMinLrAboveASmallLrIsAWarning) {
  const auto r = run_cli("train --data " + kAbsent + " --max-steps 10 --lr 1e-5");
  EXPECT_NE(r.err.find("train: warning: --lr 1e-05 is below the default --min-lr 3e-05, so the schedule rises toward "
                       "--min-lr; give --min-lr (e.g. 1e-06)\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(kAbsent), std::string::npos) << r.err;
  const std::string path = testing::scratch_dir().string() + "/run.toml";
  write_file_atomic(path, "[train]\nmin_lr = 3e-5\n");
  EXPECT_EQ(run_cli("--config " + path + " train --data " + kAbsent + " --lr 1e-5").err,
            "llamatrain train: error: --min-lr 3e-05 is above --lr 1e-05; the cosine schedule decays from --lr down to "
            "--min-lr\n");
}

// ---- output directories -------------------------------------------------------------------

TEST(CliOutputs, UnwritableOutputsAreRefusedBeforeAnyWork) {
  const std::string dir = testing::scratch_dir().string();
  const std::string file = dir + "/a-file";
  write_file_atomic(file, "x");
  const std::string bad = file + "/sub";
  const std::string train = "train --data " + kAbsent;
  expect_refused({
      {train + " --output " + bad,
       "llamatrain train: error: --output " + bad + ": cannot create the directory (Not a directory)"},
      {train + " --checkpoint-dir " + bad,
       "llamatrain train: error: --checkpoint-dir " + bad + ": cannot create the directory (Not a directory)"},
      {train + " --metrics " + bad + "/m.jsonl",
       "llamatrain train: error: --metrics " + bad + ": cannot create the directory (Not a directory)"},
      {"prepare --text " + kAbsent + " --seq-len 8 --output " + bad + "/d.h5",
       "llamatrain prepare: error: --output " + bad + ": cannot create the directory (Not a directory)"},
      {"convert --input " + kAbsent + " --output " + bad + "/m.h5",
       "llamatrain convert: error: --output " + bad + ": cannot create the directory (Not a directory)"},
  });
  // A missing directory is made, then the run goes on (here to the missing dataset), leaving no probe file.
  const std::string fresh = dir + "/new/out";
  const auto r = run_cli(train + " --output " + fresh + " --checkpoint-dir " + dir + "/new/ck");
  EXPECT_NE(r.err.find(kAbsent), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_directory(fresh));
  EXPECT_TRUE(std::filesystem::is_empty(fresh));
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/new/ck"));
}

TEST(CliOutputs, CheckWritableDirNamesTheOptionAndTheReason) {
  const std::string dir = testing::scratch_dir().string();
  EXPECT_EQ(testing::error_of([&] { check_writable_dir(dir + "/x/y", "--output"); }), "<no error>");
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/x/y"));
  write_file_atomic(dir + "/f", "");
  EXPECT_EQ(testing::error_of([&] { check_writable_dir(dir + "/f", "--output"); }),
            "--output " + dir + "/f: exists and is not a directory");
}

#ifdef LLAMATRAIN_MPIEXEC
// Under mpirun: every rank checks --checkpoint-dir, so every rank fails alike and the message is
// printed once; --output is rank 0's, so rank 0 is named and rank 1 exits too (no hang, no abort).
TEST(CliOutputsMpi, UnwritableDirectoryStopsEveryRankWithOneMessage) {
  const std::string dir = testing::scratch_dir().string();
  write_file_atomic(dir + "/a-file", "x");
  const std::string bad = dir + "/a-file/sub";
  const auto a = testing::run_mpi(2, "train --data " + kAbsent + " --checkpoint-dir " + bad);
  EXPECT_EQ(a.status, 1) << a.err;
  const std::string message =
      "llamatrain train: error: --checkpoint-dir " + bad + ": cannot create the directory (Not a directory)\n";
  ASSERT_NE(a.err.find(message), std::string::npos) << a.err;
  EXPECT_EQ(a.err.find(message, a.err.find(message) + 1), std::string::npos) << "printed twice: " << a.err;
  EXPECT_EQ(a.err.find("MPI_ABORT"), std::string::npos) << a.err;
  const auto b = testing::run_mpi(2, "train --data " + kAbsent + " --output " + bad);
  EXPECT_EQ(b.status, 1) << b.err;
  EXPECT_NE(b.err.find("llamatrain train: error: [rank 0] --output " + bad + ": cannot create the directory"),
            std::string::npos)
      << b.err;
  EXPECT_EQ(b.err.find("MPI_ABORT"), std::string::npos) << b.err;
}
#endif

// ---- GPU names and the build ----------------------------------------------------------------

// The names scripts/slurm/train-hetero.sbatch writes into its hostfile are accepted by info and
// plan alike (one lookup), shown as the table's types; an unknown name is refused by both.
TEST(CliGpuNames, SlurmHostfileNamesWorkInInfoAndPlan) {
  const std::string script = read_file_bytes(std::string(LLAMATRAIN_SOURCE_DIR) + "/scripts/slurm/train-hetero.sbatch");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(script, m, std::regex("gpu_type=\\$\\(.*echo (\\S+) \\|\\| echo (\\S+)\\)")));
  const std::string dir = testing::scratch_dir().string();
  const std::string hosts = dir + "/hostfile";
  // The script writes no nic_gbps=, which plan needs for a job across hosts.
  write_file_atomic(
      hosts, "n1 slots=2 # gpu=" + m[1].str() + " nic_gbps=100\nn2 slots=2 # gpu=" + m[2].str() + " nic_gbps=100\n");
  const auto info = run_cli("info --hostfile " + hosts);
  ASSERT_EQ(info.status, 0) << info.err;
  EXPECT_NE(info.out.find("(2 A100-SXM4-80GB, 2 H100-SXM5-80GB)"), std::string::npos) << info.out;
  const auto plan =
      run_cli("plan --hostfile " + hosts + " --model-config tiny --seq-len 64 --global-batch 8 --tokens 100000");
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_NE(plan.out.find("H100-SXM5-80GB"), std::string::npos) << plan.out;

  write_file_atomic(hosts, "n1 slots=2 # gpu=a101\n");
  const std::string refused = hosts + ":1:14: gpu=a101: unknown GPU type 'a101'; known types: " + known_gpu_names() + "\n";
  EXPECT_EQ(run_cli("info --hostfile " + hosts).err, "llamatrain info: error: " + refused);
  EXPECT_EQ(
      run_cli("plan --hostfile " + hosts + " --model-config tiny --seq-len 64 --global-batch 8 --tokens 100000").err,
      "llamatrain plan: error: " + refused);
}

TEST(CliInfo, ReportsTheBackendsLinkedIn) {
  const auto r = run_cli("info");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find("not built yet"), std::string::npos) << r.out;
#if LLAMATRAIN_SANITIZE_BUILD  // its CLI leaves the simulator out (src/backend/cuda/CMakeLists.txt)
  EXPECT_NE(r.out.find("; cuda-sim: not built"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("cuda-sim (the CUDA kernels on the CPU simulator)"), std::string::npos) << r.out;
#endif
#if LLAMATRAIN_HAVE_CUDA_TOOLKIT
  EXPECT_NE(r.out.find("backends:     cpu; cuda (GPU, built for sm_80 sm_90)"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("cuda: not built (no CUDA toolkit at build time)"), std::string::npos) << r.out;
#endif
}

}  // namespace
}  // namespace lt

// The command line model.h5 records (its /training command_line) splits back into the same
// arguments in a POSIX shell: plain words as they are, anything else single-quoted.
TEST(CliOptions, CommandLineTextQuotesWhatAShellWouldSplit) {
  const char* argv[] = {"build/llamatrain", "train", "--data", "my data.h5", "--lr=3e-4", "it's", "", "a$b"};
  EXPECT_EQ(lt::cli::command_line_text(8, argv),
            "build/llamatrain train --data 'my data.h5' --lr=3e-4 'it'\\''s' '' 'a$b'");
  // /bin/sh's own word splitting of the line (popen) gives the arguments back, one per line.
  const std::string line = lt::cli::command_line_text(8, argv);
  FILE* p = popen(("for a in " + line + "; do printf '[%s]\\n' \"$a\"; done").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  pclose(p);
  EXPECT_EQ(out, "[build/llamatrain]\n[train]\n[--data]\n[my data.h5]\n[--lr=3e-4]\n[it's]\n[]\n[a$b]\n");
}
