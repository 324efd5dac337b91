#include "cli/prompt_options.h"

#include "cli/ranges.h"
#include "llamatrain/error.h"

namespace lt::cli {

PromptCliHandles add_prompt_options(CLI::App* sub, PromptCliOptions& p, const std::string& scope,
                                    const std::string& prompt_type_help) {
  PromptCliHandles h;
  // A range, not a member list: an empty value (--prompt-type '') is refused, not read as 0.
  h.prompt_type = in_range(sub->add_option("--prompt-type", p.prompt_type, scope + prompt_type_help), ints_between(1, 3));
  h.template_text = sub->add_option(
      "--template", p.template_text,
      scope + "prompt format instead of --prompt-type: llama2-chat (\"[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n"
              "{question}\\n\\n{context} [/INST] \" + answer), alpaca, qa-inline-markers, qa-section-markers, a "
              "template with {question}, optional {context} and {answer} once (the text after {answer} ends each "
              "answer), or @FILE holding one");
  h.template_text->excludes(h.prompt_type);
  p.template_option = h.template_text;
  sub->add_option("--system", p.system,
                  scope + "system prompt of --template llama2-chat (default: \"" + kLlama2ChatSystem + "\")");
  return h;
}

PromptFormat prompt_format_of(const PromptCliOptions& p, const PromptFormat& fallback) {
  if (p.template_given()) return PromptFormat::from_option(p.template_text, p.system);
  if (!p.system.empty()) fail("--system is for --template llama2-chat");
  if (p.prompt_type > 0) return PromptFormat::from_prompt_type(p.prompt_type);
  return fallback;
}

}  // namespace lt::cli
