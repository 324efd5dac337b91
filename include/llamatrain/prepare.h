// `llamatrain prepare --text`: plain text -> SentencePiece tokens -> packed rows -> HDF5 dataset
// (format in dataset.h). The steps are exposed separately so tests can check each one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llamatrain/dataset.h"
#include "llamatrain/qa.h"

namespace lt {

class Tokenizer;
class Progress;

// Settings shared by `prepare --text` and `prepare --qa`.
struct PrepareCommonOptions {
  std::string output_path;     // DATA.h5, written atomically
  int seq_len = 256;           // rows hold seq_len+1 tokens
  std::string tokenizer_path;  // existing .model; empty: train one and save it beside the output
                               // as tokenizer_model_path_for(output_path)
  int vocab_size = 512;
  std::string model_type = "bpe";  // bpe | unigram
  double test_split = 0.1;     // fraction held out, in [0, 1)
  uint64_t seed = 1234;        // split shuffle and tokenizer training
  bool quiet = false;          // no progress bar and no summary on stderr
};

struct PrepareTextOptions : PrepareCommonOptions {
  std::string text_path;       // plain text (UTF-8, read as raw bytes), or "builtin:tinytales"
                               // (kBuiltinCorpusName) for the embedded corpus
  bool skip_invalid = false;   // drop bytes that are not valid UTF-8 (counted on stderr) instead
                               // of refusing the file with the offset of the first one
};

struct PrepareTextResult {
  int64_t train_rows = 0;
  int64_t test_rows = 0;
  int64_t stream_tokens = 0;   // BOS + encode(text)
  int vocab_size = 0;
  std::string tokenizer_path;  // the model used (given or trained)
  bool tokenizer_trained = false;
  double seconds = 0;
};

// Runs the whole pipeline; throws lt::Error naming the file or option at fault.
PrepareTextResult prepare_text(const PrepareTextOptions& opt);

// Peak bytes prepare holds for `text_bytes` of input tokenized into `stream_tokens` tokens and
// cut into rows of seq_len+1: the text, the stream (int32), and the rows (int32 token + uint8
// loss mask each) twice, once all together and once split into train and test. At least one row.
double prepare_peak_bytes(double text_bytes, double stream_tokens, int seq_len);

// "<output without .h5>.model" (or "<output>.model" when it does not end in .h5).
std::string tokenizer_model_path_for(const std::string& output_path);

// BOS followed by the tokens of the whole text: the same ids as tok.encode(text, true, false),
// computed in line-aligned chunks on several threads (see prepare_text.cpp for why that is
// exact). `progress` (may be null) is updated with the bytes done; `chunked` (may be null) is
// set to whether the chunked path was used rather than the one-call fallback.
std::vector<int32_t> encode_text_stream(const Tokenizer& tok, const std::string& text,
                                        Progress* progress = nullptr, bool* chunked = nullptr);

// Cuts a token stream of N tokens into rows of seq_len+1 tokens overlapping by one token:
// row i = stream[i*L .. i*L+L] with L = seq_len, so every token but the first is a target
// exactly once. n_seq = ceil((N-1)/L) for N >= 2 (else 0); a shorter last row is padded with
// token 0 and mask 0. loss_mask[:, 0] = 0, 1 elsewhere except padding.
TokenSplit pack_rows(const std::vector<int32_t>& stream, int seq_len);

// Held-out rows: a Fisher-Yates shuffle of 0..n_rows-1 driven by splitmix64(seed) (lt::Rng and
// lt::shuffle, so every platform and standard library gives the same split); the first
// round(test_fraction * n_rows) shuffled rows, at least 1 when test_fraction > 0 and
// n_rows >= 2, at most n_rows-1, go to test. Both lists are returned in ascending order.
struct RowSplit {
  std::vector<int64_t> train;
  std::vector<int64_t> test;
};
RowSplit split_rows(int64_t n_rows, double test_fraction, uint64_t seed);

// The given rows of `all`, in the given order.
TokenSplit select_rows(const TokenSplit& all, const std::vector<int64_t>& rows);

// ---- `llamatrain prepare --qa`: question/context/answer records -> packed fine-tuning data ----

struct PrepareQaOptions : PrepareCommonOptions {
  std::string qa_path;          // JSONL, JSON array or PubMedQA ori_pqal.json (qa.h); examples
                                // never straddle rows; test_split holds out whole examples
  PromptFormat format;          // how a record becomes text (qa.h): --prompt-type, --template
  AnswerField answer_field = AnswerField::kLongAnswer;  // what each record is trained on
  std::string test_ids_path;    // the test split is exactly the examples of these ids (qa.h
                                // read_id_file); test_split must then be 0
  bool train_on_prompt = false; // loss on prompt tokens too (BOS never carries loss)
  // The loss weight of each answer's decision (the yes/no/maybe label its answer ends with under
  // --answer-field both or final_decision, and the answer's end after it); 1: none (every token alike).
  int decision_weight = 1;
  int min_answer_tokens = 1;
  bool skip_invalid = false;
  bool compare_sentencepiece = false;  // also time SentencePiece's own Encode on the same texts
};

// How the ids of --test-ids fared: listed (distinct ids in the file), in the test split, dropped
// (by curation, or too long for --seq-len), with the dropped ids in list order.
struct TestIdsReport {
  int64_t listed = 0, in_test = 0, dropped = 0;
  std::vector<std::string> dropped_ids;
};

struct PrepareQaResult {
  int64_t records = 0, invalid = 0, kept = 0, truncated = 0, too_long = 0;
  int64_t train_examples = 0, test_examples = 0, train_rows = 0, test_rows = 0;
  int64_t tokens = 0;
  TestIdsReport test_ids;       // with test_ids_path
  double tokens_per_s = 0;      // prepare's tokenization of the examples (both cores)
  double sp_tokens_per_s = 0;   // SentencePiece's own Encode on the same texts, one thread
                                // (only with compare_sentencepiece)
  std::string tokenizer_path;
  std::string report_json;      // stored as the curation_report attribute
  double seconds = 0;
};

PrepareQaResult prepare_qa(const PrepareQaOptions& opt);

// One tokenized example: BOS, the tokens of prompt + answer + suffix, EOS.
struct QaExample {
  std::vector<int32_t> tokens;
  int32_t answer_offset = 0;  // index of the first token that covers answer text
  // index of the first token of the decision the answer ends with (its label); -1: none
  int32_t decision_offset = -1;
  int8_t label = -1;
  std::string id;
  bool truncated = false;     // the context was shortened to fit
  std::string context;        // the context the tokens hold: the record's, or what was kept of it
};
// Tokenizes a record in `format`; an example longer than max_tokens has its context cut from the
// end until it fits. Returns false when even an empty context does not fit.
// complete = false leaves out the answer suffix and EOS (scoring a candidate continuation).
// lead: text between the prompt and the answer that belongs to the prompt side (no loss, not in
// the answer's tokens), e.g. a generated long answer and kFinalDecisionLead when eval scores the
// decision of --answer-field both.
bool tokenize_example(const Tokenizer& tok, const QaRecord& rec, const PromptFormat& format, int max_tokens,
                      QaExample* out, bool complete = true, const std::string& lead = "");

// Refuses a --test-ids list with ids that no record has: "<list>: N of the M listed ids are not
// among the R records read from <records_path>, e.g. 'a', 'b', 'c'".
void check_listed_ids_present(const IdList& list, const std::string& list_path, const std::vector<QaRecord>& records,
                              const std::string& records_path);
// The examples of the listed ids to test, every other one to train, each in its order; report
// counts the listed ids that reached test and those that did not (dropped before).
void split_examples_by_ids(std::vector<QaExample> examples, const IdList& list, std::vector<QaExample>* train,
                           std::vector<QaExample>* test, TestIdsReport* report);

struct QaReadOptions;
struct QaReadReport;
// read_qa_file, plus the embedded default set when `source` is builtin:factqa.
std::vector<QaRecord> load_qa_records(const std::string& source, const QaReadOptions& opt, QaReadReport* report);
// Packs examples in order into rows of seq_len+1 tokens; an example never straddles two rows
// (each must be at most seq_len+1 tokens). Loss on answer tokens and EOS (on every token but
// BOS with train_on_prompt); positions restart at 0 at each BOS; padding is token 0, mask 0.
// decision_weight: the loss mask of each example's tokens from its decision_offset on (1: none).
TokenSplit pack_examples(const std::vector<QaExample>& examples, int seq_len, bool train_on_prompt,
                         int decision_weight = 1);

// "yes" -> 0, "no" -> 1, "maybe" -> 2, anything else -> -1.
int8_t label_code(const std::string& label);
const char* label_name(int8_t code);

}  // namespace lt
