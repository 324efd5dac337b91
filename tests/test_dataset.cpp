// lt::Dataset: save/load round trip and the validation load() performs, with exact messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;



lt::TokenSplit make_split(int64_t n_seq, int seq_len, int vocab, int salt) {
  lt::TokenSplit s;
  s.n_seq = n_seq;
  s.seq_len = seq_len;
  const int64_t w = seq_len + 1;
  for (int64_t i = 0; i < n_seq * w; ++i) {
    s.tokens.push_back(static_cast<int32_t>((i * 31 + salt) % vocab));
    s.loss_mask.push_back(i % w == 0 || (i % 7 == 3) ? 0 : 1);
  }
  return s;
}

lt::Dataset make_dataset() {
  lt::Dataset d;
  d.info.seq_len = 8;
  d.info.vocab_size = 512;
  d.info.bos_id = 1;
  d.info.eos_id = 2;
  d.tokenizer_model = std::string("\x0a\x03\x00\xffproto", 9);
  d.info.tokenizer_sha256 = lt::sha256_hex(d.tokenizer_model);
  d.info.source_sha256 = lt::sha256_hex("source");
  d.info.source_path = "/data/corpus.txt";
  d.info.prompt_template = "none";
  d.info.tool_version = "0.1.0";
  d.info.seed = 0xfedcba9876543210ULL;  // above 2^63: stored as int64 bits
  d.info.test_split = 0.25;
  d.train = make_split(5, 8, 512, 1);
  d.test = make_split(2, 8, 512, 2);
  return d;
}

// Writes a file in the dataset layout with chosen defects.
struct RawFile {
  std::string format = "llamatrain-dataset";
  int64_t version = 1;
  int64_t seq_len = 256;
  int64_t vocab_size = 512;
  uint64_t rows = 3, cols = 257, mask_cols = 257;
  int32_t bad_token = -7;  // written at [1, 2] unless -7
  uint8_t bad_mask = 0;    // written at [2, 5] unless 0
  void write(const std::string& path) const {
    auto f = lt::h5::File::create(path);
    f.write_attr("/", "format", format);
    f.write_attr("/", "format_version", version);
    f.write_attr("/", "seq_len", seq_len);
    f.write_attr("/", "vocab_size", vocab_size);
    std::vector<int32_t> tokens(rows * cols, 5);
    std::vector<uint8_t> mask(rows * mask_cols, 1);
    if (bad_token != -7) tokens[1 * cols + 2] = bad_token;
    if (bad_mask) mask[2 * mask_cols + 5] = bad_mask;
    f.write("/train/tokens", {rows, cols}, tokens.data());
    f.write("/train/loss_mask", {rows, mask_cols}, mask.data());
    f.close();
  }
};

}  // namespace

TEST(Dataset, SaveLoadRoundTrip) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "data.h5").string();
  const lt::Dataset d = make_dataset();
  d.save(path);
  // Published atomically: only the final file is left.
  EXPECT_FALSE(lt::file_exists(lt::temp_path_for(path)));
  const lt::Dataset r = lt::Dataset::load(path);
  EXPECT_EQ(r.path, path);
  EXPECT_EQ(r.info.seq_len, 8);
  EXPECT_EQ(r.info.vocab_size, 512);
  EXPECT_EQ(r.info.bos_id, 1);
  EXPECT_EQ(r.info.eos_id, 2);
  EXPECT_EQ(r.info.tokenizer_sha256, d.info.tokenizer_sha256);
  EXPECT_EQ(r.info.source_sha256, d.info.source_sha256);
  EXPECT_EQ(r.info.source_path, "/data/corpus.txt");
  EXPECT_EQ(r.info.prompt_template, "none");
  EXPECT_EQ(r.info.tool_version, "0.1.0");
  EXPECT_EQ(r.info.seed, 0xfedcba9876543210ULL);
  EXPECT_EQ(r.info.test_split, 0.25);
  EXPECT_EQ(r.tokenizer_model, d.tokenizer_model);
  EXPECT_EQ(r.train.n_seq, 5);
  EXPECT_EQ(r.train.seq_len, 8);
  EXPECT_EQ(r.train.tokens, d.train.tokens);
  EXPECT_EQ(r.train.loss_mask, d.train.loss_mask);
  EXPECT_EQ(r.test.n_seq, 2);
  EXPECT_EQ(r.test.tokens, d.test.tokens);
  EXPECT_EQ(r.test.loss_mask, d.test.loss_mask);
  // 45 cells in train, 5 in column 0 and those with i % 7 == 3 masked out.
  int64_t expect = 0;
  for (int64_t i = 0; i < 45; ++i) expect += !(i % 9 == 0 || i % 7 == 3);
  EXPECT_EQ(r.train.loss_tokens(), expect);
  EXPECT_EQ(r.train.row_tokens(2)[0], d.train.tokens[18]);
  EXPECT_EQ(r.train.row_mask(4)[8], d.train.loss_mask[44]);
  // The file carries the creation time and is readable by generic HDF5 tools.
  auto f = lt::h5::File::open_read(path);
  EXPECT_EQ(f.read_attr_string("/", "format"), "llamatrain-dataset");
  EXPECT_EQ(f.read_attr_string("/", "created_utc").size(), 20u);  // 2024-01-02T03:04:05Z
  EXPECT_EQ(f.shape("/train/tokens"), (lt::h5::Dims{5, 9}));
  EXPECT_EQ(f.shape("/test/loss_mask"), (lt::h5::Dims{2, 9}));
  fs::remove_all(dir);
}

TEST(Dataset, EmptyTestSplit) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "data.h5").string();
  lt::Dataset d = make_dataset();
  d.test = make_split(0, 8, 512, 0);
  d.save(path);
  const auto r = lt::Dataset::load(path);
  EXPECT_EQ(r.test.n_seq, 0);
  EXPECT_EQ(r.test.seq_len, 8);
  EXPECT_TRUE(r.test.tokens.empty());
  EXPECT_EQ(r.train.n_seq, 5);
  fs::remove_all(dir);
}

TEST(Dataset, SaveRejectsInconsistentSplits) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "data.h5").string();
  lt::Dataset d = make_dataset();
  d.train.tokens.pop_back();
  EXPECT_NE(error_of([&] { d.save(path); }).find("5 rows of 9 need 45 tokens and mask values, have 44 and 45"),
            std::string::npos);
  EXPECT_FALSE(lt::file_exists(path));
  EXPECT_FALSE(lt::file_exists(lt::temp_path_for(path)));
  fs::remove_all(dir);
}

TEST(Dataset, ValidationErrorsNameFileAndField) {
  const fs::path dir = scratch_dir();
  const std::string p = (dir / "data.h5").string();
  auto load_error = [&](const RawFile& raw) {
    raw.write(p);
    return error_of([&] { lt::Dataset::load(p); });
  };
  RawFile ok;
  ok.write(p);
  EXPECT_EQ(lt::Dataset::load(p).train.n_seq, 3);

  RawFile cols = ok;
  cols.cols = cols.mask_cols = 129;
  EXPECT_EQ(load_error(cols), p + ": /train/tokens has 129 columns, expected seq_len+1 = 257");
  RawFile big = ok;
  big.bad_token = 512;
  EXPECT_EQ(load_error(big), p + ": /train/tokens[1, 2] = 512 is outside [0, vocab_size = 512)");
  RawFile neg = ok;
  neg.bad_token = -1;
  EXPECT_EQ(load_error(neg), p + ": /train/tokens[1, 2] = -1 is outside [0, vocab_size = 512)");
  RawFile mask = ok;
  mask.bad_mask = 2;
  EXPECT_EQ(load_error(mask), p + ": /train/loss_mask[2, 5] = 2, expected 0 or 1");
  RawFile mask_shape = ok;
  mask_shape.mask_cols = 256;
  EXPECT_EQ(load_error(mask_shape), p + ": /train/loss_mask shape differs from /train/tokens (3 x 257)");
  RawFile format = ok;
  format.format = "something-else";
  EXPECT_EQ(load_error(format), p + ": format attribute is 'something-else', expected 'llamatrain-dataset'");
  RawFile version = ok;
  version.version = 3;
  EXPECT_EQ(load_error(version), p + ": format_version 3 is not supported (this build reads 1 to 2)");
  RawFile seq = ok;
  seq.seq_len = 0;
  EXPECT_EQ(load_error(seq), p + ": attribute seq_len = 0 is out of range");

  // A file that is HDF5 but not ours, a file that is not HDF5, a missing file.
  {
    auto f = lt::h5::File::create(p);
    std::vector<float> w = {1};
    f.write("/weights", {1}, w.data());
    f.close();
  }
  EXPECT_EQ(error_of([&] { lt::Dataset::load(p); }), p + ": not a llamatrain dataset (no format attribute on /)");
  lt::write_file_atomic(p, "tokens,mask\n1,0\n");
  EXPECT_EQ(error_of([&] { lt::Dataset::load(p); }), p + ": not an HDF5 file");
  fs::remove(p);
  EXPECT_EQ(error_of([&] { lt::Dataset::load(p); }), p + ": cannot open (no such file)");
  fs::remove_all(dir);
}

TEST(Dataset, DetectsTokenizerMismatch) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "data.h5").string();
  lt::Dataset d = make_dataset();
  d.info.tokenizer_sha256 = lt::sha256_hex("another model");
  d.save(path);
  EXPECT_EQ(error_of([&] { lt::Dataset::load(path); }),
            path + ": /tokenizer/model does not match attribute tokenizer_sha256");
  fs::remove_all(dir);
}

namespace {

// A packed split of one row holding three examples: yes, maybe and an unlabelled one, with ids
// that a '\n'-joined layout could not hold (the third one has a newline).
lt::TokenSplit packed_split() {
  lt::TokenSplit s = make_split(1, 8, 512, 3);
  s.positions = {0, 1, 2, 0, 1, 2, 0, 1, 2};
  s.examples = {{0, 0, 3, 1, 0, "pubmed-21645374"}, {0, 3, 3, 2, 2, "séance 2"}, {0, 6, 3, 1, -1, "a\nb"}};
  return s;
}

// What load() makes of `s` after a round trip through `path`.
void expect_same_examples(const lt::TokenSplit& got, const lt::TokenSplit& want) {
  ASSERT_EQ(got.examples.size(), want.examples.size());
  for (size_t i = 0; i < want.examples.size(); ++i) {
    EXPECT_EQ(got.examples[i].id, want.examples[i].id) << i;
    EXPECT_EQ(int(got.examples[i].label), int(want.examples[i].label)) << i;
    EXPECT_EQ(got.examples[i].offset, want.examples[i].offset) << i;
  }
}

}  // namespace

// Issue 14 §5: ids are one string per row and labels an enum whose members name the codes, so a
// reader who never saw the tool (h5dump, h5py) sees "pubmed-21645374" and "yes", not bytes and 0.
TEST(Dataset, IdsAreStringsAndLabelsAreNamed) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "qa.h5").string();
  lt::Dataset d = make_dataset();
  d.train = packed_split();
  d.test = make_split(0, 8, 512, 2);
  d.save(path);
  {
    auto f = lt::h5::File::open_read(path);
    EXPECT_EQ(f.read_attr_int("/", "format_version"), 2);
    EXPECT_EQ(f.kind("/train/examples/ids"), lt::h5::File::Kind::kString);
    EXPECT_EQ(f.read_strings("/train/examples/ids"),
              (std::vector<std::string>{"pubmed-21645374", "séance 2", "a\nb"}));
    ASSERT_EQ(f.kind("/train/examples/label"), lt::h5::File::Kind::kEnum);
    lt::h5::File::EnumMembers members;
    EXPECT_EQ(f.read_enum("/train/examples/label", &members), (std::vector<int64_t>{0, 2, -1}));
    EXPECT_EQ(members, (lt::h5::File::EnumMembers{{"none", -1}, {"yes", 0}, {"no", 1}, {"maybe", 2}}));
  }
  expect_same_examples(lt::Dataset::load(path).train, d.train);
  fs::remove_all(dir);
}

// A packed dataset written the way format_version 1 did: ids as one uint8 array of the ids
// joined by '\n', labels as bare int8 codes.
// `labels`, when given, writes /train/examples/label instead.
void write_version1(const std::string& path, const lt::TokenSplit& s,
                    const std::function<void(lt::h5::File&)>& labels = {}) {
  auto f = lt::h5::File::create(path);
  f.write_attr("/", "format", std::string("llamatrain-dataset"));
  f.write_attr("/", "format_version", int64_t{1});
  f.write_attr("/", "seq_len", int64_t{s.seq_len});
  f.write_attr("/", "vocab_size", int64_t{512});
  const lt::h5::Dims dims = {uint64_t(s.n_seq), uint64_t(s.seq_len + 1)};
  f.write("/train/tokens", dims, s.tokens.data());
  f.write("/train/loss_mask", dims, s.loss_mask.data());
  f.write("/train/positions", dims, s.positions.data());
  std::vector<int64_t> row;
  std::vector<int32_t> offset, length, answer;
  std::vector<int8_t> label;
  std::string ids;
  for (const lt::ExampleSpan& e : s.examples) {
    row.push_back(e.row), offset.push_back(e.offset), length.push_back(e.length);
    answer.push_back(e.answer_offset), label.push_back(e.label);
    ids += (ids.empty() ? "" : "\n") + e.id;
  }
  const lt::h5::Dims ed = {s.examples.size()};
  f.write("/train/examples/row", ed, row.data());
  f.write("/train/examples/offset", ed, offset.data());
  f.write("/train/examples/length", ed, length.data());
  f.write("/train/examples/answer_offset", ed, answer.data());
  if (labels) labels(f);
  else f.write("/train/examples/label", ed, label.data());
  f.write("/train/examples/ids", {ids.size()}, reinterpret_cast<const uint8_t*>(ids.data()));
  f.close();
}

// Files of format_version 1 still load, examples and all.
TEST(Dataset, ReadsTheVersion1ExampleLayout) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "old.h5").string();
  lt::TokenSplit s = packed_split();
  s.examples[2].id = "c";  // version 1 could not hold a newline
  write_version1(path, s);
  const lt::Dataset r = lt::Dataset::load(path);
  EXPECT_EQ(r.train.examples.size(), 3u);
  EXPECT_EQ(r.train.examples[0].id, "pubmed-21645374");
  expect_same_examples(r.train, s);
  EXPECT_EQ(r.test.n_seq, 0);
  fs::remove_all(dir);
}

// An enum written by another tool with other codes is read by its member names; an unknown
// name is an error naming the file, the dataset and the name.
TEST(Dataset, LabelEnumIsReadByNameAndUnknownNamesAreRefused) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "other.h5").string();
  lt::TokenSplit s = packed_split();
  s.examples[2].id = "c";
  write_version1(path, s, [](lt::h5::File& f) {
    f.write_enum("/train/examples/label", {5, 7, 0}, {{"none", 0}, {"yes", 5}, {"no", 6}, {"maybe", 7}});
  });
  const lt::Dataset r = lt::Dataset::load(path);
  EXPECT_EQ(int(r.train.examples[0].label), 0);   // yes
  EXPECT_EQ(int(r.train.examples[1].label), 2);   // maybe
  EXPECT_EQ(int(r.train.examples[2].label), -1);  // none
  write_version1(path, s, [](lt::h5::File& f) {
    f.write_enum("/train/examples/label", {1, 1, 1}, {{"yes", 0}, {"perhaps", 1}});
  });
  EXPECT_EQ(error_of([&] { lt::Dataset::load(path); }),
            path + ": /train/examples/label has a label 'perhaps'; expected yes, no, maybe or none");
  write_version1(path, s, [](lt::h5::File& f) {
    f.write_enum("/train/examples/label", {0, 9, -1}, {{"none", -1}, {"yes", 0}, {"no", 1}, {"maybe", 2}});
  });
  EXPECT_EQ(error_of([&] { lt::Dataset::load(path); }),
            path + ": /train/examples/label[1] is no member of its enum type (a value written without conversion?)");
  fs::remove_all(dir);
}
