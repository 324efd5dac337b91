// check_config (config_file.h): the file's sections and keys against the commands and their
// options, before CLI11 applies the file, so that every problem names its line.
#include <algorithm>

#include "cli/config_file.h"
#include "cli/ranges.h"
#include "cli/suggest.h"
#include "llamatrain/error.h"

namespace lt::cli {

namespace {

const char* kind_name(ConfigValueKind k) {
  switch (k) {
    case ConfigValueKind::string:
      return "a string";
    case ConfigValueKind::number:
      return "a number";
    case ConfigValueKind::boolean:
      return "true/false";
    case ConfigValueKind::array:
      return "an array";
  }
  return "?";
}

// The kind of value an option takes: a flag true/false, a numeric type a number (a size such
// as --max-shard-size also "5GB"), anything else a string.
bool kind_fits(const CLI::Option* op, ConfigValueKind k, std::string* expected) {
  if (op->get_expected_min() == 0) {
    *expected = "true or false";
    return k == ConfigValueKind::boolean;
  }
  const std::string type = op->get_type_name();
  const std::string base = type.substr(0, type.find(':'));
  if (base == "INT" || base == "UINT" || base == "FLOAT") {
    *expected = type.find("SIZE") != std::string::npos ? "a number or a size such as \"5GB\"" : "a number";
    return k == ConfigValueKind::number || (k == ConfigValueKind::string && type.find("SIZE") != std::string::npos);
  }
  *expected = "a string (in quotes)";
  return k == ConfigValueKind::string;
}

std::vector<std::string> option_names(const CLI::App* sub) {
  std::vector<std::string> names;
  for (const CLI::Option* op : sub->get_options())
    for (const std::string& n : op->get_lnames())
      if (n != "help") names.push_back(n);
  return names;
}

CLI::Option* find_option(CLI::App* sub, const std::string& name) {
  if (name == "help") return nullptr;
  for (CLI::Option* op : sub->get_options())
    for (const std::string& n : op->get_lnames())
      if (n == name) return op;
  return nullptr;
}

// The option's own conversion and range check on the value, without keeping the result.
void check_value(CLI::Option* op, const ConfigEntry& e, const std::string& at) {
  std::string problem;
  try {
    op->add_result(e.values);
    op->run_callback();
  } catch (const OptionError& err) {
    problem = "expected " + err.expected();
  } catch (const CLI::Error& err) {
    problem = err.what();
  }
  op->clear();
  if (!problem.empty()) fail(strcat(at, e.key, " = ", e.text, ": ", problem));
}

void check_entry(const ConfigEntry& e, CLI::App* sub, const std::string& path) {
  const std::string at = strcat(path, ":", e.line, ": ");
  const std::string name = config_key_to_option(e.key);
  CLI::Option* op = find_option(sub, name);
  if (!op) {
    const std::string hint = did_you_mean(name, option_names(sub));
    fail(strcat(at, "unknown key '", e.key, "' in [", sub->get_name(), "]",
                hint.empty() ? strcat(" (the keys are the options of llamatrain ", sub->get_name(),
                                      " --help, without the dashes)")
                             : hint));
  }
  std::string expected;
  const bool many = op->get_items_expected_max() > 1;
  if (e.kind == ConfigValueKind::array) {
    if (!many) fail(strcat(at, e.key, " = ", e.text, ": expected one value, not an array"));
    for (ConfigValueKind k : e.element_kinds)
      if (!kind_fits(op, k, &expected))
        fail(strcat(at, e.key, " = ", e.text, ": expected an array of ", expected, ", found ", kind_name(k)));
  } else if (!kind_fits(op, e.kind, &expected)) {
    fail(strcat(at, e.key, " = ", e.text, ": expected ", expected, ", found ", kind_name(e.kind)));
  }
  if (op->get_expected_min() != 0) check_value(op, e, at);
}

}  // namespace

void check_config(const ConfigFile& cf, CLI::App& root) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : root.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  std::string listed;
  for (const auto& c : commands) listed += (listed.empty() ? "" : ", ") + c;
  for (const ConfigSection& s : cf.sections)
    if (std::find(commands.begin(), commands.end(), s.name) == commands.end())
      fail(strcat(cf.path, ":", s.line, ": unknown section [", s.name, "]", did_you_mean(s.name, commands),
                  " (sections are commands: ", listed, ")"));
  for (const ConfigEntry& e : cf.entries) {
    if (e.section.empty())
      fail(strcat(cf.path, ":", e.line, ": ", e.key,
                  " is outside a section; options go under their command, e.g. [train]"));
    check_entry(e, root.get_subcommand(e.section), cf.path);
  }
}

}  // namespace lt::cli
