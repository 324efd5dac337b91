// Prompt formats. The three layouts of --prompt-type come from the reference deployment's
// create_dataset.py: type 1 is Stanford Alpaca's template (github.com/tatsu-lab/stanford_alpaca,
// PROMPT_DICT), with its no-input variant for an empty context; types 2 and 3 wrap the parts in
// marker strings that prepare makes single tokenizer pieces. llama2-chat is the layout Meta's chat
// models were tuned on (github.com/meta-llama/llama, generation.py: B_INST, B_SYS); templates are
// the user's own.
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"
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

namespace {

const char* const kTypeNames[3] = {"alpaca", "qa-inline-markers", "qa-section-markers"};

// A template cut at its placeholders: text pieces and placeholder names, in order.
struct TemplatePart {
  bool placeholder = false;
  std::string text;  // the literal text, or the placeholder's name
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::vector<TemplatePart> split_template(const std::string& t) {
  std::vector<TemplatePart> parts(1);
  for (size_t i = 0; i < t.size();) {
    size_t end = i + 1;
    while (t[i] == '{' && end < t.size() && is_name_char(t[end])) ++end;
    if (t[i] == '{' && end > i + 1 && end < t.size() && t[end] == '}') {
      parts.push_back({true, t.substr(i + 1, end - i - 1)});
      parts.push_back({});
      i = end + 1;
    } else {
      parts.back().text += t[i++];
    }
  }
  return parts;
}

// The refusals of a template: an unknown placeholder, {answer} missing or repeated, {question}
// missing before it, a placeholder after it, text that is not UTF-8.
void check_template(const std::string& t, const std::string& origin) {
  if (!is_valid_utf8(t)) fail(strcat(origin, ": the template is not valid UTF-8"));
  int answers = 0, questions = 0;
  for (const TemplatePart& p : split_template(t)) {
    if (!p.placeholder) continue;
    if (p.text != "question" && p.text != "context" && p.text != "answer")
      fail(strcat(origin, ": unknown placeholder {", p.text, "} in the template; the placeholders are {question}, ",
                  "{context} and {answer}"));
    if (answers > 0)
      fail(strcat(origin, ": {", p.text, "} after {answer}; the prompt is the text before {answer}, and the text after ",
                  "it (the answer's suffix) takes no placeholder"));
    answers += p.text == "answer";
    questions += p.text == "question";
  }
  if (answers == 0)
    fail(strcat(origin, ": the template has no {answer}; it needs {question}, then {answer} once, e.g. ",
                "'Question: {question} Context: {context} Answer: {answer}'"));
  if (questions == 0) fail(strcat(origin, ": the template has no {question} before {answer}"));
}

}  // namespace

PromptFormat PromptFormat::from_prompt_type(int type) {
  check_prompt_type(type);
  PromptFormat f;
  f.type_ = type;
  return f;
}

PromptFormat PromptFormat::llama2_chat(const std::string& system) {
  PromptFormat f;
  f.kind_ = Kind::kLlama2Chat;
  f.type_ = 0;
  f.text_ = system;
  return f;
}

PromptFormat PromptFormat::from_template(const std::string& text, const std::string& origin) {
  check_template(text, origin);
  PromptFormat f;
  f.kind_ = Kind::kTemplate;
  f.type_ = 0;
  f.text_ = text;
  return f;
}

PromptFormat PromptFormat::from_option(const std::string& value, const std::string& system) {
  if (!system.empty() && value != "llama2-chat")
    fail(strcat("--system is for --template llama2-chat (got --template '", value, "')"));
  if (!is_valid_utf8(system)) fail("--system: not valid UTF-8");
  if (value == "llama2-chat") return llama2_chat(system.empty() ? std::string(kLlama2ChatSystem) : system);
  for (int type = 1; type <= 3; ++type)
    if (value == kTypeNames[type - 1]) return from_prompt_type(type);
  if (value.empty()) fail("--template: empty; give llama2-chat, @FILE or a template with {question} and {answer}");
  // One word without braces is a name, mistyped (a template needs {question} and {answer}).
  if (value[0] != '@' && value.find_first_of("{} \t\r\n") == std::string::npos)
    fail(strcat("--template '", value, "': no such format; the names are llama2-chat, ", kTypeNames[0], ", ",
                kTypeNames[1], ", ", kTypeNames[2], " (else @FILE, or a template with {question} and {answer})"));
  if (value[0] != '@') return from_template(value);
  const std::string path = value.substr(1);
  refuse_special_file(path, "template file (--template @FILE)");
  std::string text = read_file_bytes(path);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return from_template(text, path);
}

std::string generation_prompt(const std::string& prompt) {
  const size_t end = prompt.find_last_not_of(' ');
  return end == std::string::npos ? std::string() : prompt.substr(0, end + 1);
}

PromptFormat PromptFormat::parse(const std::string& form) {
  const std::string origin = "prompt format '" + form + "'";
  nlohmann::json j;
  try {
    j = parse_json_file_text(form, origin);
  } catch (const Error&) {
    fail(strcat(origin, ": expected a JSON object such as {\"name\":\"alpaca\"}"));
  }
  const auto text = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_string()) fail(strcat(origin, ": no string \"", key, "\""));
    return j[key].get<std::string>();
  };
  if (!j.is_object()) fail(strcat(origin, ": expected a JSON object"));
  const std::string name = text("name");
  for (int type = 1; type <= 3; ++type)
    if (name == kTypeNames[type - 1]) return from_prompt_type(type);
  if (name == "llama2-chat") return llama2_chat(text("system"));
  if (name == "template") return from_template(text("template"), origin);
  fail(strcat(origin, ": unknown name '", name, "'"));
}

std::string PromptFormat::prompt(const std::string& question, const std::string& context) const {
  if (kind_ == Kind::kPromptType) return prompt_text(type_, question, context);
  if (kind_ == Kind::kLlama2Chat)
    return "[INST] <<SYS>>\n" + text_ + "\n<</SYS>>\n\n" + question + (context.empty() ? "" : "\n\n" + context) +
           " [/INST] ";
  std::string out;
  for (const TemplatePart& p : split_template(text_)) {
    if (p.placeholder && p.text == "answer") break;
    out += !p.placeholder ? p.text : p.text == "question" ? question : context;
  }
  return out;
}

std::string PromptFormat::suffix() const {
  if (kind_ == Kind::kPromptType) return answer_suffix(type_);
  if (kind_ == Kind::kLlama2Chat) return "";
  const std::vector<TemplatePart> parts = split_template(text_);
  std::string out;
  bool after = false;
  for (const TemplatePart& p : parts) {
    if (after) out += p.text;  // check_template: no placeholder follows {answer}
    after = after || (p.placeholder && p.text == "answer");
  }
  return out;
}

std::vector<std::string> PromptFormat::markers() const {
  if (kind_ == Kind::kPromptType) return prompt_markers(type_);
  if (kind_ == Kind::kLlama2Chat) return {"[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"};
  return {};
}

std::string PromptFormat::name() const {
  if (kind_ == Kind::kPromptType) return kTypeNames[type_ - 1];
  return kind_ == Kind::kLlama2Chat ? "llama2-chat" : "template";
}

int PromptFormat::prompt_type() const { return kind_ == Kind::kPromptType ? type_ : 0; }

std::string PromptFormat::to_string() const {
  nlohmann::ordered_json j;
  j["name"] = name();
  if (kind_ == Kind::kLlama2Chat) j["system"] = text_;
  if (kind_ == Kind::kTemplate) j["template"] = text_;
  return j.dump();
}

}  // namespace lt
