// The prompt-format options that prepare, eval and generate share: --prompt-type, --template and
// --system, read into one PromptFormat (qa.h).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "llamatrain/qa.h"

namespace lt::cli {

struct PromptCliOptions {
  int prompt_type = 0;        // --prompt-type 1|2|3; 0: not given
  std::string template_text;  // --template NAME | TEMPLATE | @FILE
  std::string system;         // --system TEXT (llama2-chat)
  const CLI::Option* template_option = nullptr;  // set by add_prompt_options: --template '' is given too
  bool template_given() const { return !template_text.empty() || (template_option && template_option->count() > 0); }
  bool given() const { return prompt_type > 0 || template_given() || !system.empty(); }
};

struct PromptCliHandles {
  CLI::Option* prompt_type = nullptr;
  CLI::Option* template_text = nullptr;
};
// Adds the three options; `scope` starts each help text ("--qa: ", "--task: ", "").
PromptCliHandles add_prompt_options(CLI::App* sub, PromptCliOptions& p, const std::string& scope,
                                    const std::string& prompt_type_help);

// The format the options name; `fallback` when none was given. --system needs --template llama2-chat.
PromptFormat prompt_format_of(const PromptCliOptions& p, const PromptFormat& fallback = PromptFormat());

}  // namespace lt::cli
