#include "cli/arguments.h"

#include "cli/suggest.h"
#include "llamatrain/error.h"

namespace lt::cli {

namespace {

std::vector<std::string> command_names(CLI::App& root) {
  std::vector<std::string> names;
  for (const CLI::App* sub : root.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "unknown option --max-stepz; did you mean --max-steps?" for the first unexpected option, or
// "unexpected argument 'x'" for a stray word.
std::string extras_message(CLI::App& root, CLI::App* sub) {
  const std::vector<std::string> extras = root.remaining(true);
  for (const std::string& x : extras) {
    if (x.rfind("--", 0) != 0) continue;
    std::vector<std::string> names;
    if (sub)
      for (const CLI::Option* op : sub->get_options())
        for (const std::string& n : op->get_lnames()) names.push_back("--" + n);
    const std::string option = x.substr(0, x.find('='));
    const std::string near = nearest_name(option, names);
    return strcat("unknown option ", option, near.empty() ? "" : "; did you mean " + near + "?");
  }
  return extras.empty() ? std::string("unexpected arguments") : strcat("unexpected argument '", extras[0], "'");
}

}  // namespace

std::string command_word(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config")
      ++i;
    else if (!a.empty() && a[0] != '-')
      return a;
  }
  return "";
}

std::string command_line_text(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_./=:,+@%") == std::string::npos;
    std::string quoted = "'";
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += (i ? " " : "") + (plain ? a : quoted + "'");
  }
  return line;
}

void check_command_word(const std::string& word, CLI::App& root) {
  if (word.empty()) return;
  const std::vector<std::string> names = command_names(root);
  for (const auto& n : names)
    if (n == word) return;
  const std::string hint = did_you_mean(word, names);
  fail(strcat("unknown command '", word, "'", hint.empty() ? "; the commands are " + joined(names) : hint));
}

std::string parse_error_message(const CLI::ParseError& e, CLI::App& root, CLI::App* sub) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) return extras_message(root, sub);
  if (!sub && dynamic_cast<const CLI::RequiredError*>(&e))
    return strcat("a command is required: ", joined(command_names(root)), " (llamatrain --help)");
  return e.what();
}

}  // namespace lt::cli
