// Question/context/answer records for fine-tuning: reading the reference formats, the prompt
// formats (the three layouts of the reference deployment's create_dataset.py, Llama 2's chat
// layout, templates), the answer a record is trained on, id lists, and curation.
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

// The system prompt of --template llama2-chat when --system is not given.
constexpr const char* kLlama2ChatSystem =
    "You are a biomedical research assistant. Answer the question from the given context.";

// How a record becomes text: prompt(q, c) + answer + suffix(), with BOS and EOS around it from the
// tokenizer's ids. One of
//   the three layouts of --prompt-type (names alpaca, qa-inline-markers, qa-section-markers);
//   llama2-chat: "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{question}\n\n{context} [/INST] " and no
//     suffix ("{question} [/INST] " when the context is empty), as Meta's chat models were tuned;
//   a template (name "template"): text with the placeholders {question} (at least once), {context}
//     (optional) and {answer} (exactly once, after every other placeholder); the prompt is the text
//     before {answer}, the suffix the text after it. A placeholder is '{', a name of letters, digits
//     and '_', then '}'; any other brace is text.
// to_string() is a one-line JSON object ({"name":"alpaca"}, {"name":"llama2-chat","system":"..."},
// {"name":"template","template":"..."}) that parse() turns back into the same format; datasets
// store it (attribute prompt_format).
class PromptFormat {
 public:
  PromptFormat() = default;  // alpaca (--prompt-type 1)
  static PromptFormat from_prompt_type(int type);  // throws as check_prompt_type
  static PromptFormat llama2_chat(const std::string& system = kLlama2ChatSystem);
  // A template string; errors name `origin` ("--template", or the file of --template @FILE).
  static PromptFormat from_template(const std::string& text, const std::string& origin = "--template");
  // The value of --template: llama2-chat, alpaca, qa-inline-markers, qa-section-markers, @FILE (a
  // template read from FILE, one trailing newline dropped) or a template string. `system` (empty:
  // kLlama2ChatSystem) is for llama2-chat only; given with another format it is refused.
  static PromptFormat from_option(const std::string& value, const std::string& system = "");
  static PromptFormat parse(const std::string& form);  // to_string()'s form; throws lt::Error
  // A value of --template that looks like a mistyped name (one word, no braces) is refused with
  // the list of names.

  std::string prompt(const std::string& question, const std::string& context) const;
  std::string suffix() const;
  std::vector<std::string> markers() const;
  std::string name() const;
  int prompt_type() const;  // 1-3 for the --prompt-type layouts, else 0
  std::string to_string() const;
  bool operator==(const PromptFormat& o) const { return to_string() == o.to_string(); }
  bool operator!=(const PromptFormat& o) const { return !(*this == o); }

 private:
  enum class Kind { kPromptType, kLlama2Chat, kTemplate };
  Kind kind_ = Kind::kPromptType;
  int type_ = 1;
  std::string text_;  // the system prompt (llama2-chat) or the template
};

// The prompt as generation starts from it: `prompt` without its trailing spaces. Training
// tokenizes prompt + answer as one text, where SentencePiece joins a prompt's trailing space to
// the answer's first piece ("▁Yes"); the prompt side of a trained example therefore never ends
// in a lone "▁", and generation leaves that space for the model's first token to write
// (llama2-chat's " [/INST] ", templates such as "Answer: {answer}").
std::string generation_prompt(const std::string& prompt);

// What a record is trained on (--answer-field):
//   long_answer     the record's answer text (LONG_ANSWER of ori_pqal.json, "answer" of JSON lines)
//   final_decision  its label: "yes", "no" or "maybe"
//   both            answer + kFinalDecisionLead + label: the long answer, then a last line
//                   "Final decision: yes"
// final_decision and both need a label on every record.
enum class AnswerField { kLongAnswer, kFinalDecision, kBoth };
constexpr const char* kFinalDecisionLead = "\nFinal decision: ";
// "long_answer" | "final_decision" | "both"; parse throws lt::Error naming --answer-field.
const char* answer_field_name(AnswerField f);
AnswerField parse_answer_field(const std::string& name);
// Sets each record's answer to the text `field` trains on. A record without the label the field
// needs is invalid: "<origin>: no final_decision (yes, no or maybe) for --answer-field <field>"
// thrown, or with skip_invalid dropped and counted in report (invalid, problems).
void select_answers(std::vector<QaRecord>& records, AnswerField field, bool skip_invalid, QaReadReport* report);

// A file of ids (prepare --test-ids, eval --ids): a JSON array of ids (strings or integers), a
// JSON object keyed by id (test_ground_truth.json; a string value is that id's label), or plain
// text with one id per line (surrounding whitespace and blank lines ignored). Ids keep the file's
// order, each once. An object's values are labels: strings, trimmed and lower-cased, that must
// be yes, no or maybe (anything else is refused naming the id). Errors name the file.
struct IdList {
  std::vector<std::string> ids;
  std::vector<std::string> labels;  // per id: the object's label, else ""
  std::string format;               // "json-array" | "json-object" | "lines"
};
IdList read_id_file(const std::string& path);
// "'a', 'b', 'c'" for the first `shown` ids, then ", ..." when there are more (for messages).
std::string quoted_ids(const std::vector<std::string>& ids, size_t shown = 3);

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
