// Reading JSON from files: every JSON input (a QA file or JSONL line, --ids, a Hugging Face
// config.json, a safetensors header, metrics and calibration files, a checkpoint's stored
// configuration) passes through check_json_depth before it is parsed.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace lt {

// The deepest nesting of arrays and objects a JSON input may have. nlohmann's parser keeps its own
// stack, but walking or printing a parsed value recurses once per level, and 100,000 levels
// overflow the stack; real inputs nest a few levels.
constexpr int kMaxJsonDepth = 256;

// The offset of the bracket at which text's arrays and objects first nest deeper than max_depth,
// or std::string_view::npos. Brackets inside strings do not count.
size_t json_too_deep_at(std::string_view text, int max_depth = kMaxJsonDepth);

// Refuses text whose arrays and objects nest deeper than max_depth, before it is parsed:
// "ORIGIN:LINE:COLUMN: JSON nests deeper than 256 levels (arrays and objects)". Brackets inside
// strings do not count; the text need not be valid JSON (the parser says what else is wrong).
// first_line: the line of the file on which the text begins (a JSONL record's line).
void check_json_depth(std::string_view text, const std::string& origin, int64_t first_line = 1,
                      int max_depth = kMaxJsonDepth);

// check_json_depth, then nlohmann's parse; a syntax error fails with
// "ORIGIN: not valid JSON (<the parser's message>)".
nlohmann::json parse_json_file_text(std::string_view text, const std::string& origin);

// check_json_depth, then a parse that must give an object (config.json, a safetensors index):
// "ORIGIN: not valid JSON" or "ORIGIN: not a JSON object".
nlohmann::json parse_json_object_text(std::string_view text, const std::string& origin);

}  // namespace lt
