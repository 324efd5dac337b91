// Plain text -> HDF5 dataset. Pipeline: load or train a tokenizer, encode the text into one
// stream (BOS + tokens), cut it into overlapping rows, hold out a seeded random subset of rows,
// write the dataset atomically.
#include "llamatrain/prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "llamatrain/builtin_corpus.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/memory.h"
#include "llamatrain/progress.h"
#include "llamatrain/rng.h"
#include "llamatrain/tokenizer.h"
#include "llamatrain/utf8.h"

namespace lt {
namespace {

// Text is encoded in chunks of about this many bytes, each cut just after a '\n'.
constexpr size_t kChunkBytes = size_t(1) << 16;

std::string line_before(const std::string& text, size_t boundary) {
  // The line that ends with the '\n' at boundary-1 (newline included).
  size_t begin = boundary >= 2 ? text.rfind('\n', boundary - 2) : std::string::npos;
  begin = begin == std::string::npos ? 0 : begin + 1;
  return text.substr(begin, boundary - begin);
}

std::string line_after(const std::string& text, size_t boundary) {
  size_t end = text.find('\n', boundary);
  end = end == std::string::npos ? text.size() : end + 1;
  return text.substr(boundary, end - boundary);
}

// Why chunked encoding equals encoding the whole text in one call:
// SentencePiece only adds its dummy-prefix "▁" at the start of an encode call, and a chunk
// after the first starts right after a '\n'. Encoding "\n" + chunk therefore sees the chunk in
// the same context as the whole-text call, and dropping the leading ids of encode("\n")
// leaves exactly the chunk's ids, provided no vocabulary piece spans a newline (BPE merges and
// unigram lattice paths then cannot cross it). Models where that does not hold (a piece with
// '\n', a normaliser that rewrites newlines, unknown-piece merging without byte fallback) are
// caught by the checks below and the text is then encoded in one call.
class ChunkEncoder {
 public:
  explicit ChunkEncoder(const Tokenizer& tok) : tok_(tok), newline_(tok.encode("\n", false, false)) {
    usable_ = !newline_.empty();
    for (int id = 0; usable_ && id < tok.vocab_size(); ++id)
      if (tok.piece(id).find('\n') != std::string::npos) usable_ = false;
  }
  bool usable() const { return usable_; }

  // The ids `chunk` contributes when it follows a newline inside a larger text; empty optional
  // when the prefix is not where it must be.
  std::optional<std::vector<int32_t>> after_newline(const std::string& chunk) const {
    std::vector<int32_t> ids = tok_.encode("\n" + chunk, false, false);
    if (ids.size() < newline_.size() || !std::equal(newline_.begin(), newline_.end(), ids.begin()))
      return std::nullopt;
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(newline_.size()));
    return ids;
  }

  // Local check at one boundary: the line before it and the line after it, encoded together
  // and apart, must agree. The only interactions across a newline are between neighbouring
  // pieces, which these two lines contain. Each line is encoded in the context it has in the
  // stream: a call start for the text's first line, after a newline otherwise.
  bool boundary_ok(const std::string& text, size_t boundary) const {
    const std::string before = line_before(text, boundary), after = line_after(text, boundary);
    const bool first_line = boundary == before.size();
    auto in_place = [&](const std::string& s) -> std::optional<std::vector<int32_t>> {
      if (first_line) return tok_.encode(s, false, false);
      return after_newline(s);
    };
    auto joined = in_place(before + after);
    auto apart = in_place(before);
    const auto tail = after_newline(after);
    if (!joined || !apart || !tail) return false;
    apart->insert(apart->end(), tail->begin(), tail->end());
    return *apart == *joined;
  }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> newline_;
  bool usable_ = true;
};


std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Refuses text that is not valid UTF-8 (SentencePiece would silently map the bytes to <unk> or
// byte pieces), or with --skip-invalid drops the invalid bytes; true when bytes were dropped.
bool ensure_utf8(std::string& text, const PrepareTextOptions& opt) {
  if (!opt.skip_invalid) {
    check_utf8(text, opt.text_path,
               "convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or pass --skip-invalid to drop such bytes");
    return false;
  }
  size_t first = 0;
  const size_t dropped = drop_invalid_utf8(text, &first);
  if (dropped && !opt.quiet)
    std::fprintf(stderr,
                 "prepare: %s: dropped %zu byte(s) that are not valid UTF-8, the first at byte offset %zu "
                 "(--skip-invalid)\n",
                 opt.text_path.c_str(), dropped, first);
  if (text.empty()) fail(strcat(opt.text_path, ": no valid UTF-8 text left after --skip-invalid"));
  return dropped > 0;
}

}  // namespace

double prepare_peak_bytes(double text_bytes, double stream_tokens, int seq_len) {
  const double L = seq_len, rows = std::max(1.0, std::ceil((stream_tokens - 1) / L));
  return text_bytes + 4 * stream_tokens + 2 * rows * (L + 1) * (sizeof(int32_t) + sizeof(uint8_t));
}

std::string tokenizer_model_path_for(const std::string& output_path) {
  const std::string ext = ".h5";
  const bool has_ext = output_path.size() > ext.size() &&
                       output_path.compare(output_path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? output_path.substr(0, output_path.size() - ext.size()) : output_path) + ".model";
}

std::vector<int32_t> encode_text_stream(const Tokenizer& tok, const std::string& text,
                                        Progress* progress, bool* chunked) {
  std::vector<int32_t> stream = {tok.bos_id()};
  if (tok.bos_id() < 0) fail("the tokenizer defines no BOS token");

  // Chunk k covers [starts[k], starts[k+1]); every start after the first follows a '\n'.
  std::vector<size_t> starts = {0};
  for (size_t pos = kChunkBytes; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos || nl + 1 >= text.size()) break;
    starts.push_back(nl + 1);
    pos = nl + 1 + kChunkBytes;
  }
  starts.push_back(text.size());
  const size_t n_chunks = starts.size() - 1;

  ChunkEncoder enc(tok);
  if (chunked) *chunked = false;
  if (n_chunks == 1 || !enc.usable()) {
    const auto ids = tok.encode(text, false, false);
    stream.insert(stream.end(), ids.begin(), ids.end());
    if (progress) progress->update(static_cast<int64_t>(text.size()));
    return stream;
  }

  // Chunks are independent, so worker threads take them in order from a shared counter
  // (SentencePiece's encode is const and thread-safe); this thread reports progress.
  std::vector<std::vector<int32_t>> pieces(n_chunks);
  std::atomic<size_t> next{0};
  std::atomic<int64_t> bytes_done{0};
  std::atomic<bool> exact{true};
  std::atomic<unsigned> finished{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (size_t k; exact.load() && (k = next.fetch_add(1)) < n_chunks;) {
        const std::string chunk = text.substr(starts[k], starts[k + 1] - starts[k]);
        if (k == 0) {
          pieces[k] = tok.encode(chunk, false, false);
        } else {
          auto ids = enc.after_newline(chunk);
          if (!ids || !enc.boundary_ok(text, starts[k])) {
            exact = false;
            break;
          }
          pieces[k] = std::move(*ids);
        }
        bytes_done += static_cast<int64_t>(chunk.size());
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      exact = false;
    }
    ++finished;
  };
  const unsigned n_threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(work);
  while (progress && finished.load() < n_threads) {
    progress->update(bytes_done.load());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& th : threads) th.join();
  if (error) std::rethrow_exception(error);

  if (!exact) {
    const auto ids = tok.encode(text, false, false);
    stream.insert(stream.end(), ids.begin(), ids.end());
  } else {
    if (chunked) *chunked = true;
    size_t total = stream.size();
    for (const auto& p : pieces) total += p.size();
    stream.reserve(total);
    for (auto& p : pieces) {
      stream.insert(stream.end(), p.begin(), p.end());
      std::vector<int32_t>().swap(p);  // release as we go: large corpora hold ~2x otherwise
    }
  }
  if (progress) progress->update(static_cast<int64_t>(text.size()));
  return stream;
}

TokenSplit pack_rows(const std::vector<int32_t>& stream, int seq_len) {
  LT_CHECK(seq_len >= 1, "pack_rows: seq_len ", seq_len, " < 1");
  const int64_t n_tok = static_cast<int64_t>(stream.size());
  const int64_t len = seq_len, width = len + 1;
  TokenSplit s;
  s.seq_len = seq_len;
  s.n_seq = n_tok >= 2 ? (n_tok - 1 + len - 1) / len : 0;
  s.tokens.assign(static_cast<size_t>(s.n_seq * width), 0);
  s.loss_mask.assign(static_cast<size_t>(s.n_seq * width), 0);
  for (int64_t i = 0; i < s.n_seq; ++i) {
    const int64_t start = i * len;
    const int64_t valid = std::min(width, n_tok - start);
    std::copy(stream.begin() + start, stream.begin() + start + valid, s.tokens.begin() + i * width);
    // Column 0 is only an input (its target was the previous row's last column).
    std::fill(s.loss_mask.begin() + i * width + 1, s.loss_mask.begin() + i * width + valid, 1);
  }
  return s;
}

RowSplit split_rows(int64_t n_rows, double test_fraction, uint64_t seed) {
  LT_CHECK(n_rows >= 0 && test_fraction >= 0 && test_fraction < 1, "split_rows: n_rows ", n_rows,
           " test_fraction ", test_fraction);
  int64_t n_test = 0;
  if (test_fraction > 0 && n_rows >= 2)
    n_test = std::clamp<int64_t>(std::llround(test_fraction * static_cast<double>(n_rows)), 1,
                                 n_rows - 1);
  std::vector<int64_t> perm(static_cast<size_t>(n_rows));
  for (int64_t i = 0; i < n_rows; ++i) perm[i] = i;
  // The project's splitmix64 Fisher-Yates (rng.h), not std::shuffle: the standard leaves
  // std::shuffle's algorithm to the implementation, and the split must not depend on it.
  Rng rng(seed);
  shuffle(perm, rng);
  RowSplit split;
  split.test.assign(perm.begin(), perm.begin() + n_test);
  split.train.assign(perm.begin() + n_test, perm.end());
  std::sort(split.test.begin(), split.test.end());
  std::sort(split.train.begin(), split.train.end());
  return split;
}

TokenSplit select_rows(const TokenSplit& all, const std::vector<int64_t>& rows) {
  const size_t width = static_cast<size_t>(all.seq_len) + 1;
  TokenSplit s;
  s.seq_len = all.seq_len;
  s.n_seq = static_cast<int64_t>(rows.size());
  s.tokens.reserve(rows.size() * width);
  s.loss_mask.reserve(rows.size() * width);
  for (int64_t r : rows) {
    LT_CHECK(r >= 0 && r < all.n_seq, "select_rows: row ", r, " of ", all.n_seq);
    s.tokens.insert(s.tokens.end(), all.row_tokens(r), all.row_tokens(r) + width);
    s.loss_mask.insert(s.loss_mask.end(), all.row_mask(r), all.row_mask(r) + width);
  }
  return s;
}

PrepareTextResult prepare_text(const PrepareTextOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.seq_len < 1) fail(strcat("--seq-len must be at least 1 (got ", opt.seq_len, ")"));
  if (!(opt.test_split >= 0 && opt.test_split < 1))
    fail(strcat("--test-split must be in [0, 1) (got ", opt.test_split, ")"));
  if (opt.output_path.empty()) fail("--output: no output file given");
  if (opt.text_path.empty()) fail("--text: no text file given");
  const bool builtin = opt.text_path == kBuiltinCorpusName;
  std::string text;
  if (builtin) {
    text = builtin_corpus();
  } else {
    if (!file_exists(opt.text_path)) fail(strcat(opt.text_path, ": text file not found"));
    refuse_special_file(opt.text_path, "text file");
    if (std::filesystem::is_directory(opt.text_path))
      fail(strcat(opt.text_path, ": is a directory, expected a text file"));
    text = read_file_bytes(opt.text_path);
    if (text.empty()) fail(strcat(opt.text_path, ": empty text file"));
  }
  const bool repaired = ensure_utf8(text, opt);
  make_dirs(std::filesystem::path(opt.output_path).parent_path().string());

  PrepareTextResult result;
  std::optional<Tokenizer> tok;
  if (!opt.tokenizer_path.empty()) {
    tok = Tokenizer::load(opt.tokenizer_path);
    result.tokenizer_path = opt.tokenizer_path;
  } else {
    TokenizerTrainOptions topt;
    topt.input_path = opt.text_path;
    const std::string model_path = tokenizer_model_path_for(opt.output_path);
    // SentencePiece trains from a file, so the built-in corpus (or the text without its invalid
    // bytes) is written out for the duration.
    TempFile corpus_file;
    if (builtin || repaired) {
      corpus_file.path = temp_path_for(opt.output_path) + ".txt";
      write_file_atomic(corpus_file.path, text);
      topt.input_path = corpus_file.path;
    }
    topt.model_prefix = model_path.substr(0, model_path.size() - std::string(".model").size());
    topt.vocab_size = opt.vocab_size;
    topt.model_type = opt.model_type;
    topt.seed = opt.seed;
    if (!opt.quiet)
      std::fprintf(stderr, "prepare: training a %s tokenizer (vocab %d) on %s\n",
                   opt.model_type.c_str(), opt.vocab_size, opt.text_path.c_str());
    result.tokenizer_path = train_tokenizer(topt);
    result.tokenizer_trained = true;
    tok = Tokenizer::load(result.tokenizer_path);
  }

  std::vector<int32_t> stream;
  {
    Progress progress("tokenize", static_cast<int64_t>(text.size()), "bytes");
    stream = encode_text_stream(*tok, text, opt.quiet ? nullptr : &progress);
    progress.finish();
  }
  if (stream.size() < 2)
    fail(strcat(opt.text_path, ": text too short: ", stream.size(),
                " token(s) with BOS, one row needs at least 2"));

  check_memory_fits(prepare_peak_bytes(double(text.size()), double(stream.size()), opt.seq_len),
                    strcat("prepare: ", stream.size(), " tokens in rows of ", int64_t(opt.seq_len) + 1),
                    "use a smaller --seq-len or a smaller text");
  const TokenSplit rows = pack_rows(stream, opt.seq_len);
  const RowSplit split = split_rows(rows.n_seq, opt.test_split, opt.seed);

  Dataset d;
  d.info.seq_len = opt.seq_len;
  d.info.vocab_size = tok->vocab_size();
  d.info.bos_id = tok->bos_id();
  d.info.eos_id = tok->eos_id();
  d.info.tokenizer_sha256 = tok->sha256();
  d.info.source_sha256 = sha256_hex(text);
  d.info.source_path = opt.text_path;
  d.info.prompt_template = "none";
  d.info.tool_version = LLAMATRAIN_VERSION;
  d.info.seed = opt.seed;
  d.info.test_split = opt.test_split;
  d.tokenizer_model = tok->serialized();
  d.train = select_rows(rows, split.train);
  d.test = select_rows(rows, split.test);
  d.save(opt.output_path);

  result.train_rows = d.train.n_seq;
  result.test_rows = d.test.n_seq;
  result.stream_tokens = static_cast<int64_t>(stream.size());
  result.vocab_size = tok->vocab_size();
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!opt.quiet)
    std::fprintf(stderr,
                 "prepare: %s -> %s: %lld train + %lld test rows of %d tokens, %lld tokens "
                 "(%s per byte), vocab %d (%s%s), %s s\n",
                 opt.text_path.c_str(), opt.output_path.c_str(),
                 static_cast<long long>(result.train_rows),
                 static_cast<long long>(result.test_rows), opt.seq_len + 1,
                 static_cast<long long>(result.stream_tokens),
                 fixed(static_cast<double>(stream.size()) / static_cast<double>(text.size()), 3)
                     .c_str(),
                 result.vocab_size, result.tokenizer_trained ? "trained, " : "",
                 result.tokenizer_path.c_str(), fixed(result.seconds, 1).c_str());
  return result;
}

}  // namespace lt
