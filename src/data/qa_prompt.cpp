// The three prompt layouts (--prompt-type) of the reference deployment's create_dataset.py.
// Type 1 is Stanford Alpaca's template (github.com/tatsu-lab/stanford_alpaca, PROMPT_DICT), with
// its no-input variant for an empty context; types 2 and 3 wrap the parts in marker strings that
// prepare makes single tokenizer pieces.
#include "llamatrain/error.h"
#include "llamatrain/qa.h"

namespace lt {

void check_prompt_type(int type) {
  if (type < 1 || type > 3) fail(strcat("--prompt-type must be 1, 2 or 3 (got ", type, ")"));
}

std::string prompt_text(int type, const std::string& question, const std::string& context) {
  check_prompt_type(type);
  if (type == 1) {
    if (context.empty())
      return "Below is an instruction that describes a task. Write a response that appropriately completes the "
             "request.\n\n### Instruction:\n" +
             question + "\n\n### Response:\n";
    return "Below is an instruction that describes a task, paired with an input that provides further context. "
           "Write a response that appropriately completes the request.\n\n### Instruction:\n" +
           question + "\n\n### Input:\n" + context + "\n\n### Response:\n";
  }
  if (type == 2) return "<START_Q>" + question + (context.empty() ? "" : " " + context) + "<END_Q><START_A>";
  return "<START_Q>" + question + "<END_Q><START_C>" + context + "<END_C><START_A>";
}

std::string answer_suffix(int type) {
  check_prompt_type(type);
  return type == 1 ? "" : "<END_A>";
}

std::vector<std::string> prompt_markers(int type) {
  check_prompt_type(type);
  if (type == 1) return {};
  if (type == 2) return {"<START_Q>", "<END_Q>", "<START_A>", "<END_A>"};
  return {"<START_Q>", "<END_Q>", "<START_C>", "<END_C>", "<START_A>", "<END_A>"};
}

}  // namespace lt
