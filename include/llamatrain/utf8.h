// UTF-8 well-formedness (Unicode 15, Table 3-7): the check every text input passes before it is
// tokenized (prepare --text, eval --text, generate's prompt), and the --skip-invalid repair.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace lt {

// Length of the well-formed UTF-8 sequence at p (n bytes available), 0 when ill-formed.
size_t utf8_sequence_length(const unsigned char* p, size_t n);

// Offset of the first byte that does not start a well-formed sequence; std::string::npos when
// s is valid UTF-8.
size_t first_invalid_utf8(std::string_view s);

// Throws lt::Error "<origin>: not valid UTF-8 at byte offset N (line L, column C: byte 0xFF); <advice>"
// when s is not valid UTF-8.
void check_utf8(std::string_view s, const std::string& origin, const std::string& advice);

// Removes every byte that is not part of a well-formed sequence; returns how many were removed
// and sets *first (may be null) to the offset of the first one in the original text.
size_t drop_invalid_utf8(std::string& s, size_t* first = nullptr);

}  // namespace lt
