// `--config FILE`: the settings of a run in a TOML file with one section per command,
//
//   [train]                        # the options of `llamatrain train`, without the dashes
//   model-config = "stories15m"    # strings in quotes
//   max_steps = 2000               # '_' and '-' are the same in keys
//   no-progress = true             # flags take true or false
//   calibrate = ["a.jsonl", "b.jsonl"]
//
// read by our own reader (a TOML subset: sections, `key = value` with strings, numbers as TOML
// 1.0 writes them, booleans, one-line arrays of those, comments; in one pass, however many keys)
// so that the whole file is checked before any work: a syntax error, an unknown section or key (with the nearest valid one suggested), a
// value of the wrong kind or out of its option's range is an error naming the file and line.
// Options given on the command line win over the file.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace lt::cli {

enum class ConfigValueKind { string, number, boolean, array };

struct ConfigEntry {
  std::string section;  // "" before the first [section]
  std::string key;      // as written
  ConfigValueKind kind = ConfigValueKind::string;
  std::vector<ConfigValueKind> element_kinds;  // an array's elements
  std::vector<std::string> values;             // the scalar, or the array's elements; strings unquoted
  std::string text;                            // the value as written (for messages)
  int line = 0;
};

struct ConfigSection {
  std::string name;
  int line = 0;
};

struct ConfigFile {
  std::string path;
  std::vector<ConfigSection> sections;
  std::vector<ConfigEntry> entries;
};

// Throws lt::Error "<origin>:<line>: <what>" on a syntax error or a key given twice.
ConfigFile parse_config_text(const std::string& text, const std::string& origin);
ConfigFile read_config_file(const std::string& path);

// A key as CLI11 names the option: '_' read as '-'.
std::string config_key_to_option(const std::string& key);

// Checks every section against root's subcommands and every key against that subcommand's
// options (kind and range); throws lt::Error "<path>:<line>: ..." at the first problem.
void check_config(const ConfigFile& cf, CLI::App& root);

// The FILE of `--config FILE` or `--config=FILE` in argv, or "".
std::string config_path_in_args(int argc, const char* const* argv);

// CLI11's reader of the config file (app.config_formatter): the same grammar and key spelling.
class ConfigReader : public CLI::Config {
 public:
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
};

}  // namespace lt::cli
