// The answer a record is trained on (--answer-field): its long answer, its yes/no/maybe label, or
// both, the label on a last line after the long answer.
#include "llamatrain/error.h"
#include "llamatrain/qa.h"

namespace lt {

const char* answer_field_name(AnswerField f) {
  switch (f) {
    case AnswerField::kFinalDecision: return "final_decision";
    case AnswerField::kBoth: return "both";
    default: return "long_answer";
  }
}

AnswerField parse_answer_field(const std::string& name) {
  for (AnswerField f : {AnswerField::kLongAnswer, AnswerField::kFinalDecision, AnswerField::kBoth})
    if (name == answer_field_name(f)) return f;
  fail(strcat("--answer-field ", name, ": expected final_decision, long_answer or both"));
}

void select_answers(std::vector<QaRecord>& records, AnswerField field, bool skip_invalid, QaReadReport* report) {
  if (field == AnswerField::kLongAnswer) return;
  std::vector<QaRecord> kept;
  kept.reserve(records.size());
  for (QaRecord& r : records) {
    if (r.label.empty()) {
      const std::string problem = strcat(r.origin, ": no final_decision (yes, no or maybe) for --answer-field ",
                                         answer_field_name(field));
      if (!skip_invalid) fail(problem);
      if (report != nullptr) {
        ++report->invalid;
        report->problems.push_back(problem);
      }
      continue;
    }
    r.answer = field == AnswerField::kFinalDecision ? r.label : r.answer + kFinalDecisionLead + r.label;
    kept.push_back(std::move(r));
  }
  records = std::move(kept);
}

}  // namespace lt
