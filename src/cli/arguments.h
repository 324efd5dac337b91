// The command line before and after CLI11: the command word (to refuse a misspelled command with
// a suggestion) and CLI11's parse errors in the `llamatrain CMD: error: ...` form.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace lt::cli {

// The first argument that is neither an option nor the value of --config: the command the user
// meant ("" when there is none, e.g. `llamatrain --help`).
std::string command_word(int argc, const char* const* argv);

// The arguments as one line a POSIX shell would split back into them: an argument with anything
// but letters, digits and -_./=:,+@% is single-quoted (' as '\''). For the record in model.h5.
std::string command_line_text(int argc, const char* const* argv);

// Throws lt::Error "unknown command 'trian'; did you mean 'train'?" when word names no
// subcommand of root.
void check_command_word(const std::string& word, CLI::App& root);

// One line saying what was wrong with the arguments of `sub` (nullptr: before any command).
std::string parse_error_message(const CLI::ParseError& e, CLI::App& root, CLI::App* sub);

}  // namespace lt::cli
