// Curation of question/answer records: exact duplicates (after normalising whitespace and ASCII
// case) and answers shorter than --min-answer-tokens are dropped; every drop is listed.
#include <nlohmann/json.hpp>

#include <unordered_map>
#include <utility>

#include "llamatrain/error.h"
#include "llamatrain/qa.h"

namespace lt {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Runs of ASCII whitespace -> one space, trimmed, ASCII lower-cased. Bytes >= 0x80 are left as
// they are, so UTF-8 text is never split inside a character.
std::string normalise(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (char c : s) {
    if (is_ascii_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
  }
  return out;
}

// The duplicate key: each normalised part prefixed with its length, so that no split of the same
// bytes between question, context and answer gives the same key.
std::string duplicate_key(const QaRecord& r) {
  std::string key;
  for (const std::string* part : {&r.question, &r.context, &r.answer}) {
    const std::string n = normalise(*part);
    key += std::to_string(n.size());
    key += ':';
    key += n;
  }
  return key;
}

std::string name_of(const QaRecord& r, size_t index) {
  if (!r.origin.empty()) return r.origin;
  if (!r.id.empty()) return r.id;
  return strcat("record ", index);
}

}  // namespace

std::string CurationReport::to_json() const {
  nlohmann::ordered_json j;
  j["input"] = input;
  j["kept"] = kept;
  j["dropped"] = {{"duplicate", duplicates}, {"short_answer", short_answers}};
  return j.dump();
}

std::vector<QaRecord> curate(std::vector<QaRecord> records, const CurationOptions& opt,
                             const std::function<int(const std::string&)>& count_tokens,
                             CurationReport* report) {
  CurationReport local;
  if (report == nullptr) report = &local;
  *report = CurationReport{};
  report->input = int64_t(records.size());
  LT_CHECK(count_tokens || opt.min_answer_tokens <= 0, "curate: min_answer_tokens > 0 needs a token counter");

  // The length check comes first: a record dropped for its short answer is not the "kept one"
  // that a later duplicate names.
  std::unordered_map<std::string, std::string> kept_origin;  // duplicate key -> origin of the kept record
  std::vector<QaRecord> kept;
  kept.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    QaRecord& r = records[i];
    const std::string name = name_of(r, i);
    if (opt.min_answer_tokens > 0) {
      const int n = count_tokens(r.answer);
      if (n < opt.min_answer_tokens) {
        ++report->short_answers;
        report->dropped.push_back(strcat(name, ": answer has ", n, n == 1 ? " token" : " tokens",
                                         ", fewer than --min-answer-tokens ", opt.min_answer_tokens));
        continue;
      }
    }
    const auto [it, inserted] = kept_origin.emplace(duplicate_key(r), name);
    if (!inserted) {
      ++report->duplicates;
      report->dropped.push_back(strcat(name, ": duplicate of ", it->second));
      continue;
    }
    kept.push_back(std::move(r));
  }
  report->kept = int64_t(kept.size());
  return kept;
}

}  // namespace lt
