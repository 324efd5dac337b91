// The embedded question/context/answer dataset: determinism, the JSON-lines format, label
// proportions, answers that are the evidence without the label and quote the context, "maybe" items absent
// from the context, labels that need the context (not the question alone), no duplicate
// (question, context) pairs, a small vocabulary, and a round trip through read_qa_file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/error.h"
#include "llamatrain/qa.h"
#include "test_util.h"

namespace {

struct Rec {
  std::string id, question, context, answer, label;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<Rec> parse(const std::string& text) {
  std::vector<Rec> out;
  for (const std::string& line : lines_of(text)) {
    const auto j = nlohmann::json::parse(line);
    out.push_back({j.at("id").get<std::string>(), j.at("question").get<std::string>(),
                   j.at("context").get<std::string>(), j.at("answer").get<std::string>(),
                   j.at("final_decision").get<std::string>()});
  }
  return out;
}

const std::vector<Rec>& default_records() {
  static const std::vector<Rec> recs = parse(lt::builtin_qa_jsonl(4000, 1));
  return recs;
}

// "Is the red ball in the kitchen?" / "Can we find the red ball in the kitchen?" -> (item, place)
std::pair<std::string, std::string> item_and_place(const std::string& question) {
  static const std::regex re("^(?:Is|Can we find) the ([a-z]+ [a-z]+) in the ([a-z]+)\\?$");
  std::smatch m;
  if (!std::regex_match(question, m, re)) return {"", ""};
  return {m[1].str(), m[2].str()};
}

std::vector<std::string> sentences(const std::string& context) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t dot; (dot = context.find(". ", start)) != std::string::npos; start = dot + 2)
    out.push_back(context.substr(start, dot + 1 - start));
  out.push_back(context.substr(start));
  return out;
}

TEST(BuiltinQa, NameAndDefaults) {
  EXPECT_STREQ(lt::kBuiltinQaName, "builtin:factqa");
  EXPECT_EQ(lt::builtin_qa_jsonl(), lt::builtin_qa_jsonl(4000, 1));
}

TEST(BuiltinQa, DeterministicForASeedAndDifferentForAnother) {
  const std::string a = lt::builtin_qa_jsonl(500, 7), b = lt::builtin_qa_jsonl(500, 7);
  const std::string c = lt::builtin_qa_jsonl(500, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Not just a different order: most contexts of the other seed are new.
  std::set<std::string> ctx_a;
  for (const Rec& r : parse(a)) ctx_a.insert(r.context);
  int shared = 0;
  for (const Rec& r : parse(c)) shared += int(ctx_a.count(r.context));
  EXPECT_LT(shared, 5);
  // A prefix of a longer run is the shorter run (the generator does not look ahead).
  EXPECT_EQ(lt::builtin_qa_jsonl(1000, 7).substr(0, a.size()), a);
}

TEST(BuiltinQa, LineCountsAndFields) {
  EXPECT_EQ(lt::builtin_qa_jsonl(0, 1), "");
  EXPECT_EQ(lt::builtin_qa_jsonl(-3, 1), "");
  for (int n : {1, 7, 20, 123}) {
    const std::string text = lt::builtin_qa_jsonl(n, 3);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    EXPECT_EQ(int(lines_of(text).size()), n) << n;
  }
  const std::vector<std::string> lines = lines_of(lt::builtin_qa_jsonl(4000, 1));
  ASSERT_EQ(lines.size(), 4000u);
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(lines[i])) << "line " << i + 1;
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j.size(), 5u) << lines[i];
    for (const char* key : {"id", "question", "context", "answer", "final_decision"}) {
      ASSERT_TRUE(j.contains(key)) << key << " missing: " << lines[i];
      ASSERT_TRUE(j[key].is_string()) << key << ": " << lines[i];
      EXPECT_FALSE(j[key].get<std::string>().empty()) << key << ": " << lines[i];
    }
    EXPECT_EQ(j["id"], "factqa-" + std::to_string(i + 1));
    const std::string label = j["final_decision"];
    EXPECT_TRUE(label == "yes" || label == "no" || label == "maybe") << label;
  }
}

TEST(BuiltinQa, LabelProportions) {
  for (uint64_t seed : {1, 2}) {
    std::map<std::string, int> count;
    for (const Rec& r : parse(lt::builtin_qa_jsonl(4000, seed))) ++count[r.label];
    EXPECT_EQ(count.size(), 3u);
    EXPECT_NEAR(count["yes"] / 4000.0, 0.45, 0.05) << count["yes"];
    EXPECT_NEAR(count["no"] / 4000.0, 0.35, 0.05) << count["no"];
    EXPECT_NEAR(count["maybe"] / 4000.0, 0.20, 0.05) << count["maybe"];
  }
  // The quota holds per block of 20, so even a small file has every label.
  std::map<std::string, int> small;
  for (const Rec& r : parse(lt::builtin_qa_jsonl(20, 5))) ++small[r.label];
  EXPECT_EQ(small["yes"], 9);
  EXPECT_EQ(small["no"], 7);
  EXPECT_EQ(small["maybe"], 4);
}

TEST(BuiltinQa, AnswerIsTheEvidenceWithoutTheLabel) {
  // As PubMedQA's LONG_ANSWER: the label lives in final_decision; the answer never starts with it
  // (prepare --answer-field both puts it after the answer).
  for (const Rec& r : default_records()) {
    std::string first = r.answer.substr(0, r.answer.find(' '));
    while (!first.empty() && !std::isalpha(static_cast<unsigned char>(first.back()))) first.pop_back();
    for (const char* word : {"yes", "no", "maybe"}) EXPECT_NE(first, word) << r.answer;
    ASSERT_FALSE(r.answer.empty());
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(r.answer[0]))) << r.answer;
  }
}

TEST(BuiltinQa, YesAndNoAnswersQuoteTheContextAndRestateTheAskedPlace) {
  int yes = 0, no = 0, no_other_item = 0, no_unmentioned = 0;
  for (const Rec& r : default_records()) {
    if (r.label == "maybe") continue;
    const auto [item, place] = item_and_place(r.question);
    ASSERT_FALSE(item.empty()) << "unexpected question shape: " << r.question;
    // The answer: the context's sentence about the item, then the asked place restated.
    const std::string restated = " The question asks about the " + place + ".";
    ASSERT_GT(r.answer.size(), restated.size()) << r.answer;
    ASSERT_EQ(r.answer.substr(r.answer.size() - restated.size()), restated) << r.answer;
    const std::string fact = r.answer.substr(0, r.answer.size() - restated.size());
    const std::vector<std::string> sents = sentences(r.context);
    ASSERT_GE(sents.size(), 2u) << r.context;
    ASSERT_LE(sents.size(), 3u) << r.context;
    EXPECT_NE(r.context.find(fact), std::string::npos) << fact << " | " << r.context;
    EXPECT_EQ(std::count(sents.begin(), sents.end(), fact), 1) << fact << " | " << r.context;
    // The quoted fact is one sentence placing the asked item somewhere ...
    static const std::regex fact_re("^(?:[A-Z][a-z]+ (?:keeps|left) the|The) ([a-z]+ [a-z]+) (?:is )?in the ([a-z]+)\\.$");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(fact, m, fact_re)) << fact;
    EXPECT_EQ(m[1].str(), item) << fact << " | " << r.question;
    // ... and it is the only sentence of the context that mentions that item.
    int mentions = 0;
    for (const std::string& s : sents) mentions += s.find(" " + item + " ") != std::string::npos;
    EXPECT_EQ(mentions, 1) << r.context;
    if (r.label == "yes") {
      ++yes;
      EXPECT_EQ(m[2].str(), place) << fact << " | " << r.question;
    } else {
      ++no;
      EXPECT_NE(m[2].str(), place) << fact << " | " << r.question;
      // The asked place is another item's, or one the context never mentions.
      (r.context.find(" the " + place + ".") != std::string::npos ? no_other_item : no_unmentioned) += 1;
    }
  }
  EXPECT_GT(yes, 1000);
  EXPECT_GT(no, 1000);
  // Half each, within sampling noise (~1400 "no" records: 2 sigma is under 3%).
  EXPECT_NEAR(double(no_other_item) / no, 0.5, 0.05) << no_other_item << " of " << no;
  EXPECT_EQ(no_other_item + no_unmentioned, no);
}

TEST(BuiltinQa, MaybeItemsAreNotInTheContext) {
  int maybe = 0, place_mentioned = 0;
  for (const Rec& r : default_records()) {
    if (r.label != "maybe") continue;
    ++maybe;
    const auto [item, place] = item_and_place(r.question);
    ASSERT_FALSE(item.empty()) << r.question;
    EXPECT_EQ(r.context.find(" " + item + " "), std::string::npos) << item << " | " << r.context;
    EXPECT_EQ(r.answer, "The context does not say where the " + item + " is.");
    place_mentioned += r.context.find(" the " + place + ".") != std::string::npos;
    // Neither word of the item appears: each item of a context has its own colour and object.
    const std::string colour = item.substr(0, item.find(' ')), object = item.substr(item.find(' ') + 1);
    EXPECT_EQ(r.context.find(" " + colour + " "), std::string::npos) << item << " | " << r.context;
    EXPECT_EQ(r.context.find(" " + object + " "), std::string::npos) << item << " | " << r.context;
  }
  EXPECT_GT(maybe, 600);
  // The asked place being absent does not give "maybe" away.
  EXPECT_GT(place_mentioned, maybe / 5);
}

TEST(BuiltinQa, LabelIsNotAFunctionOfTheQuestion) {
  std::map<std::string, std::set<std::string>> labels_of_question;
  std::map<std::pair<std::string, std::string>, std::set<std::string>> labels_of_pair;
  std::set<std::string> shapes_with_all_labels;
  for (const Rec& r : default_records()) {
    labels_of_question[r.question].insert(r.label);
    labels_of_pair[item_and_place(r.question)].insert(r.label);
  }
  int mixed_questions = 0;
  for (const auto& [q, labels] : labels_of_question) {
    if (labels.size() < 2) continue;
    ++mixed_questions;
    if (labels.size() == 3) shapes_with_all_labels.insert(q.substr(0, q.find(" the ")));
  }
  int mixed_pairs = 0;
  for (const auto& [pair, labels] : labels_of_pair) mixed_pairs += labels.size() >= 2;
  // Thousands of examples over under 2000 question strings: many strings recur with mixed labels.
  EXPECT_GE(mixed_questions, 200) << labels_of_question.size() << " distinct questions";
  EXPECT_GE(mixed_pairs, 300) << labels_of_pair.size() << " distinct (item, place) pairs";
  // Both question shapes have at least one string seen with all three labels.
  EXPECT_EQ(shapes_with_all_labels, (std::set<std::string>{"Is", "Can we find"}));
}

TEST(BuiltinQa, NoDuplicateQuestionContextPairs) {
  std::set<std::pair<std::string, std::string>> seen;
  int duplicates = 0;
  for (const Rec& r : default_records()) duplicates += !seen.emplace(r.question, r.context).second;
  EXPECT_EQ(duplicates, 0);
}

TEST(BuiltinQa, SmallVocabulary) {
  std::set<std::string> words;
  for (const Rec& r : default_records()) {
    for (const std::string* text : {&r.question, &r.context, &r.answer}) {
      std::istringstream in(*text);
      for (std::string w; in >> w;) {
        while (!w.empty() && (w.back() == '.' || w.back() == '?')) w.pop_back();
        words.insert(w);
      }
    }
  }
  EXPECT_LE(words.size(), 150u);
  EXPECT_GE(words.size(), 40u);
}

TEST(BuiltinQa, ReadsBackWithReadQaFile) {
  const auto dir = lt::testing::scratch_dir();
  const std::string path = (dir / "factqa.jsonl").string();
  std::ofstream(path, std::ios::binary) << lt::builtin_qa_jsonl(4000, 1);
  lt::QaReadReport report;
  const auto recs = lt::read_qa_file(path, lt::QaReadOptions{}, &report);
  EXPECT_EQ(report.format, "jsonl");
  EXPECT_EQ(report.invalid, 0);
  ASSERT_EQ(recs.size(), 4000u);
  const auto& mine = default_records();
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].id, mine[i].id);
    EXPECT_EQ(recs[i].question, mine[i].question);
    EXPECT_EQ(recs[i].context, mine[i].context);
    EXPECT_EQ(recs[i].answer, mine[i].answer);
    EXPECT_EQ(recs[i].label, mine[i].label);
  }
}

TEST(BuiltinQa, SourceNamesTheDefaultSetOrNRecordsOfTheSameSequence) {
  EXPECT_EQ(lt::builtin_qa_source("builtin:factqa"), lt::builtin_qa_jsonl());
  const std::string twelve = lt::builtin_qa_source("builtin:factqa:12000").value();
  EXPECT_EQ(std::count(twelve.begin(), twelve.end(), '\n'), 12000);
  // Generated in sequence: the default set is its first 4000 lines.
  EXPECT_EQ(twelve.compare(0, lt::builtin_qa_jsonl().size(), lt::builtin_qa_jsonl()), 0);
  EXPECT_FALSE(lt::builtin_qa_source("factqa.jsonl").has_value());
  EXPECT_FALSE(lt::builtin_qa_source("builtin:factqa2").has_value());
  for (const char* bad : {"builtin:factqa:", "builtin:factqa:19", "builtin:factqa:1000001", "builtin:factqa:12k",
                          "builtin:factqa:-5", "builtin:factqa:99999999999"}) {
    try {
      lt::builtin_qa_source(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const lt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad) + ": expected builtin:factqa or builtin:factqa:N"),
                std::string::npos) << e.what();
    }
  }
}

}  // namespace
