// Question/context/answer records for fine-tuning: reading the reference formats, the three
// prompt layouts of the reference deployment's create_dataset.py, and curation.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lt {

struct QaRecord {
  std::string id;        // "id"/"pubid" field, the key of ori_pqal.json, else "line:<n>" / "index:<i>"
  std::string question;
  std::string context;   // may be empty
  std::string answer;
  std::string label;     // "yes" | "no" | "maybe" | "" (final_decision / label field, lower-cased)
  std::string origin;    // "<file>:<line>" (JSONL), "<file>:[<index>]" (array), "<file>:<key>" (dict)
};

struct QaReadOptions {
  bool skip_invalid = false;  // skip bad records (and report them) instead of stopping
};

struct QaReadReport {
  std::string format;                  // "jsonl" | "json-array" | "pubmedqa-dict"
  int64_t records = 0;                 // records seen
  int64_t invalid = 0;                 // skipped because invalid (only with skip_invalid)
  std::vector<std::string> problems;   // "<origin>: <problem>" for each skipped record
};

// Reads JSON lines, a JSON array of objects, or PubMedQA's ori_pqal.json (an object keyed by id
// whose values have QUESTION, CONTEXTS (array of strings, joined with " "), LONG_ANSWER,
// final_decision). Field names for the first two: question, answer, context (optional), id or
// pubid (optional), final_decision or label (optional). Invalid: a line that is not JSON, a
// record that is not an object, a missing or non-string question/answer, an empty (after
// trimming) question or answer, text that is not valid UTF-8. Without skip_invalid the first
// invalid record throws lt::Error "<file>:<line>: <problem>" (the line is 1-based; for arrays
// and dicts the element is named).
std::vector<QaRecord> read_qa_file(const std::string& path, const QaReadOptions& opt, QaReadReport* report);

// Prompt layouts (--prompt-type). The training text of a record is
//   prompt_text(type, q, c) + answer + answer_suffix(type)
// type 1 (Alpaca): "Below is an instruction that describes a task, paired with an input that
//   provides further context. Write a response that appropriately completes the request.\n\n"
//   "### Instruction:\n{q}\n\n### Input:\n{c}\n\n### Response:\n" and no suffix; with an empty
//   context Alpaca's no-input variant: "Below is an instruction that describes a task. Write a
//   response that appropriately completes the request.\n\n### Instruction:\n{q}\n\n### Response:\n"
// type 2: "<START_Q>{q} {c}<END_Q><START_A>" + answer + "<END_A>" (no space when c is empty)
// type 3: "<START_Q>{q}<END_Q><START_C>{c}<END_C><START_A>" + answer + "<END_A>"
std::string prompt_text(int type, const std::string& question, const std::string& context);
std::string answer_suffix(int type);
// The markers of a type (none for 1), made single pieces when prepare trains the tokenizer.
std::vector<std::string> prompt_markers(int type);
// Throws lt::Error for a type other than 1, 2, 3.
void check_prompt_type(int type);

struct CurationOptions {
  int min_answer_tokens = 1;  // answers with fewer tokens are dropped
};
struct CurationReport {
  int64_t input = 0, kept = 0, duplicates = 0, short_answers = 0;
  std::vector<std::string> dropped;  // "<origin>: duplicate of <origin>" / "<origin>: answer has N tokens"
  std::string to_json() const;       // {"input":…,"kept":…,"dropped":{"duplicate":…,"short_answer":…}}
};
// Drops exact duplicates (question, context and answer compared after collapsing whitespace runs
// to one space, trimming and lower-casing; the first occurrence is kept) and answers shorter than
// min_answer_tokens as counted by count_tokens. Order of the kept records is preserved.
std::vector<QaRecord> curate(std::vector<QaRecord> records, const CurationOptions& opt,
                             const std::function<int(const std::string&)>& count_tokens,
                             CurationReport* report);

// True when s is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(const std::string& s);

}  // namespace lt
