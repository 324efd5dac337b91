// Question/answer records: format detection, every bad-input message (file and line named),
// skip_invalid, the three prompt layouts (golden strings), curation, UTF-8 validation, and the
// real PubMedQA files of ../shared/data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/qa.h"
#include "test_util.h"

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;

std::string write_file(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::vector<lt::QaRecord> read(const std::string& path, lt::QaReadReport* report = nullptr, bool skip = false) {
  lt::QaReadOptions opt;
  opt.skip_invalid = skip;
  return lt::read_qa_file(path, opt, report);
}

std::string read_error(const std::string& path, bool skip = false) {
  return error_of([&] { read(path, nullptr, skip); });
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// ---- format detection ------------------------------------------------------------------------

TEST(QaRead, JsonLinesWithBomCrlfAndBlankLines) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, 
      "data.jsonl",
      "\xEF\xBB\xBF{\"question\": \"Q1?\", \"answer\": \"A1.\", \"context\": \"C1.\", \"id\": 17, "
      "\"final_decision\": \"Yes\"}\r\n"
      "\r\n"
      "{\"question\": \"Q2?\", \"answer\": \"A2.\", \"pubid\": \"p2\", \"label\": \" NO \"}\n"
      "   \n"
      "{\"question\": \"Q3?\", \"answer\": \"A3.\", \"context\": null}");
  lt::QaReadReport report;
  const auto recs = read(path, &report);
  EXPECT_EQ(report.format, "jsonl");
  EXPECT_EQ(report.records, 3);
  EXPECT_EQ(report.invalid, 0);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].origin, path + ":1");
  EXPECT_EQ(recs[1].origin, path + ":3");
  EXPECT_EQ(recs[2].origin, path + ":5");
  EXPECT_EQ(recs[0].id, "17");
  EXPECT_EQ(recs[1].id, "p2");
  EXPECT_EQ(recs[2].id, "line:5");
  EXPECT_EQ(recs[0].question, "Q1?");
  EXPECT_EQ(recs[0].context, "C1.");
  EXPECT_EQ(recs[0].answer, "A1.");
  EXPECT_EQ(recs[1].context, "");
  EXPECT_EQ(recs[2].context, "");
  EXPECT_EQ(recs[0].label, "yes");
  EXPECT_EQ(recs[1].label, "no");
  EXPECT_EQ(recs[2].label, "");
}

TEST(QaRead, JsonArrayWithBomKeepsOrderAndText) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "data.json",
                                      "\xEF\xBB\xBF  [\n"
                                      "  {\"question\": \"Is it na\xC3\xAFve?\", \"answer\": \"Caf\xC3\xA9 \xE2\x82\xAC 5\"},\n"
                                      "  {\"question\": \"Second?\", \"answer\": \"Two.\", \"context\": \"Ctx.\",\n"
                                      "   \"label\": \"maybe\"}\n"
                                      "]\n");
  lt::QaReadReport report;
  const auto recs = read(path, &report);
  EXPECT_EQ(report.format, "json-array");
  EXPECT_EQ(report.records, 2);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].question, "Is it na\xC3\xAFve?");
  EXPECT_EQ(recs[0].answer, "Caf\xC3\xA9 \xE2\x82\xAC 5");
  EXPECT_EQ(recs[0].id, "index:0");
  EXPECT_EQ(recs[0].origin, path + ":[0]");
  EXPECT_EQ(recs[1].id, "index:1");
  EXPECT_EQ(recs[1].origin, path + ":[1]");
  EXPECT_EQ(recs[1].context, "Ctx.");
  EXPECT_EQ(recs[1].label, "maybe");
}

TEST(QaRead, PubmedqaDictKeepsFileOrderAndJoinsContexts) {
  const auto dir = scratch_dir();
  // Keys deliberately out of sorted order: records must come out as in the file.
  const std::string path = write_file(dir, "ori.json",
                                      "{\n"
                                      "  \"300\": {\"QUESTION\": \"Q300?\", \"CONTEXTS\": [\"First.\", \"Second.\"],\n"
                                      "            \"LONG_ANSWER\": \"L300.\", \"final_decision\": \"maybe\", \"YEAR\": \"2001\"},\n"
                                      "  \"100\": {\"QUESTION\": \"Q100?\", \"CONTEXTS\": [],\n"
                                      "            \"LONG_ANSWER\": \"L100.\", \"final_decision\": \"YES\"},\n"
                                      "  \"200\": {\"QUESTION\": \"Q200?\", \"CONTEXTS\": [\"Only.\"], \"LONG_ANSWER\": \"L200.\"}\n"
                                      "}\n");
  lt::QaReadReport report;
  const auto recs = read(path, &report);
  EXPECT_EQ(report.format, "pubmedqa-dict");
  EXPECT_EQ(report.records, 3);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].id, "300");
  EXPECT_EQ(recs[1].id, "100");
  EXPECT_EQ(recs[2].id, "200");
  EXPECT_EQ(recs[0].origin, path + ":300");
  EXPECT_EQ(recs[0].question, "Q300?");
  EXPECT_EQ(recs[0].context, "First. Second.");
  EXPECT_EQ(recs[1].context, "");
  EXPECT_EQ(recs[2].context, "Only.");
  EXPECT_EQ(recs[0].answer, "L300.");
  EXPECT_EQ(recs[0].label, "maybe");
  EXPECT_EQ(recs[1].label, "yes");
  EXPECT_EQ(recs[2].label, "");
}

TEST(QaRead, SingleLineFilesAreTellApart) {
  const auto dir = scratch_dir();
  // A one-line ori_pqal.json-style dict and a one-line JSON lines file both start with '{'.
  const std::string dict = write_file(dir, 
      "dict.json", "{\"5\": {\"QUESTION\": \"q\", \"CONTEXTS\": [\"c\"], \"LONG_ANSWER\": \"a\", \"final_decision\": \"no\"}}");
  lt::QaReadReport report;
  auto recs = read(dict, &report);
  EXPECT_EQ(report.format, "pubmedqa-dict");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].id, "5");
  EXPECT_EQ(recs[0].label, "no");

  const std::string one = write_file(dir, "one.jsonl", "{\"question\": \"q\", \"answer\": \"a\"}\n");
  recs = read(one, &report);
  EXPECT_EQ(report.format, "jsonl");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].origin, one + ":1");

  // One line without "question" and not a dict: JSON lines with one bad record.
  const std::string bad = write_file(dir, "bad.jsonl", "{\"answer\": \"a\"}\n");
  EXPECT_EQ(read_error(bad), bad + ":1: missing field \"question\"");
}

// ---- bad input: each message names the file and the line / element / key ----------------------

TEST(QaReadErrors, JsonLinesEveryProblem) {
  const auto dir = scratch_dir();
  const std::string good = "{\"question\": \"q\", \"answer\": \"a\"}\n";
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {"{\"question\": \"q\"}", "missing field \"answer\""},
      {"{\"answer\": \"a\"}", "missing field \"question\""},
      {"{\"question\": 5, \"answer\": \"a\"}", "field \"question\" is not a string"},
      {"{\"question\": \"q\", \"answer\": [\"a\"]}", "field \"answer\" is not a string"},
      {"{\"question\": \"q\", \"answer\": \"  \\t\\n \"}", "empty answer"},
      {"{\"question\": \"\", \"answer\": \"a\"}", "empty question"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"context\": \"caf\xE9\"}", "field \"context\" is not valid UTF-8"},
      {"{\"question\": \"q\", \"answer\": \"\xED\xA0\x80\"}", "field \"answer\" is not valid UTF-8"},
      {"{\"qu\xFF\": \"q\", \"question\": \"q\", \"answer\": \"a\"}", "field \"qu\xEF\xBF\xBD\" is not valid UTF-8"},
      {"{\"question\": \"q\xFF", "not valid UTF-8 (byte 16)"},
      {"[1, 2]", "not a JSON object (found array)"},
      {"\"text\"", "not a JSON object (found string)"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"context\": 3}", "field \"context\" is not a string"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"final_decision\": \"perhaps\"}",
       "field \"final_decision\" is \"perhaps\", not yes, no or maybe"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"label\": 1}", "field \"label\" is not a string"},
      {"{\"question\": \"q\", \"answer\": \"a\", \"id\": [1]}", "field \"id\" is not a string or integer"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].line);
    // The bad record is on line 4: a good line, a blank line, a good line before it.
    const std::string path = write_file(dir, "case" + std::to_string(i) + ".jsonl", good + "\n" + good + cases[i].line + "\n" + good);
    EXPECT_EQ(read_error(path), path + ":4: " + cases[i].message);
    lt::QaReadReport report;
    const auto recs = read(path, &report, true);
    EXPECT_EQ(recs.size(), 3u);
    EXPECT_EQ(report.records, 4);
    EXPECT_EQ(report.invalid, 1);
    ASSERT_EQ(report.problems.size(), 1u);
    EXPECT_EQ(report.problems[0], path + ":4: " + cases[i].message);
  }
}

TEST(QaReadErrors, JsonLinesParseErrorNamesLineAndByte) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "data.jsonl",
                                      "{\"question\": \"q\", \"answer\": \"a\"}\n"
                                      "{\"question\": \"q\", \"answer\": }\n");
  const std::string err = read_error(path);
  EXPECT_TRUE(starts_with(err, path + ":2: not valid JSON (parse error at byte 29: ")) << err;
  EXPECT_NE(err.find("unexpected '}'"), std::string::npos) << err;
}

TEST(QaReadErrors, BrokenFirstLineOfJsonLines) {
  const auto dir = scratch_dir();
  // Line 1 is cut short; the file is still recognised as JSON lines because line 2 is a record.
  const std::string path = write_file(dir, "data.jsonl",
                                      "{\"question\": \"q\", \"answer\": \n"
                                      "{\"question\": \"q2\", \"answer\": \"a2\"}\n");
  EXPECT_TRUE(starts_with(read_error(path), path + ":1: not valid JSON (parse error at byte ")) << read_error(path);
  lt::QaReadReport report;
  const auto recs = read(path, &report, true);
  EXPECT_EQ(report.format, "jsonl");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].question, "q2");
  EXPECT_EQ(report.invalid, 1);

  const std::string text_first = write_file(dir, "text.jsonl", "oops\n{\"question\": \"q\", \"answer\": \"a\"}\n");
  EXPECT_TRUE(starts_with(read_error(text_first), text_first + ":1: not valid JSON (parse error at byte "))
      << read_error(text_first);
}

TEST(QaReadErrors, JsonArrayElements) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "data.json",
                                      "[{\"question\": \"q\", \"answer\": \"a\"},\n"
                                      " {\"answer\": \"a\"},\n"
                                      " 7,\n"
                                      " {\"question\": \"q\", \"answer\": \"\xC0\xAF\"},\n"
                                      " {\"question\": \"q3\", \"answer\": \"a3\"}]\n");
  EXPECT_EQ(read_error(path), path + ":[1]: missing field \"question\"");
  lt::QaReadReport report;
  const auto recs = read(path, &report, true);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].origin, path + ":[4]");
  EXPECT_EQ(report.records, 5);
  EXPECT_EQ(report.invalid, 3);
  const std::vector<std::string> expected = {
      path + ":[1]: missing field \"question\"",
      path + ":[2]: not a JSON object (found number)",
      path + ":[3]: field \"answer\" is not valid UTF-8",
  };
  EXPECT_EQ(report.problems, expected);
}

TEST(QaReadErrors, PubmedqaDictEntries) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "ori.json",
                                      "{\n"
                                      " \"111\": {\"QUESTION\": \"q\", \"CONTEXTS\": [\"c\"], \"LONG_ANSWER\": \" \"},\n"
                                      " \"222\": {\"QUESTION\": \"q\", \"CONTEXTS\": [1], \"LONG_ANSWER\": \"a\"},\n"
                                      " \"333\": \"x\",\n"
                                      " \"444\": {\"QUESTION\": \"q\", \"CONTEXTS\": [\"c\"], \"LONG_ANSWER\": \"\xF4\x90\x80\x80\"},\n"
                                      " \"555\": {\"CONTEXTS\": [\"c\"], \"LONG_ANSWER\": \"a\"},\n"
                                      " \"666\": {\"QUESTION\": \"q\", \"CONTEXTS\": [\"c\"], \"LONG_ANSWER\": \"a\", \"final_decision\": 1},\n"
                                      " \"777\": {\"QUESTION\": \"q\", \"CONTEXTS\": [\"c\", \"d\"], \"LONG_ANSWER\": \"a\"}\n"
                                      "}\n");
  EXPECT_EQ(read_error(path), path + ":111: empty answer");
  lt::QaReadReport report;
  const auto recs = read(path, &report, true);
  EXPECT_EQ(report.format, "pubmedqa-dict");
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].id, "777");
  EXPECT_EQ(recs[0].context, "c d");
  EXPECT_EQ(report.records, 7);
  EXPECT_EQ(report.invalid, 6);
  const std::vector<std::string> expected = {
      path + ":111: empty answer",
      path + ":222: field \"CONTEXTS\" is not an array of strings",
      path + ":333: not a JSON object (found string)",
      path + ":444: field \"LONG_ANSWER\" is not valid UTF-8",
      path + ":555: missing field \"QUESTION\"",
      path + ":666: field \"final_decision\" is not a string",
  };
  EXPECT_EQ(report.problems, expected);
}

TEST(QaReadErrors, WholeFileProblemsThrowEvenWhenSkipping) {
  const auto dir = scratch_dir();
  const std::string empty = write_file(dir, "empty.jsonl", " \n\n\t\n");
  const std::string text = write_file(dir, "text.txt", "\nhello world\nno json here\n");
  const std::string spread = write_file(dir, "spread.json", "{\n  \"question\": \"q\",\n  \"answer\": \"a\"\n}\n");
  const std::string other = write_file(dir, "other.json", "{\n  \"data\": [1, 2]\n}\n");
  const std::string broken_array = write_file(dir, "broken.json",
                                              "[\n"
                                              "{\"question\": \"q\", \"answer\": \"a\"},\n"
                                              "]\n");
  const std::string broken_dict = write_file(dir, "broken_dict.json",
                                             "{\n"
                                             "  \"1\": {\"QUESTION\": \"q\",\n"
                                             "         \"LONG_ANSWER\" \"a\"}\n"
                                             "}\n");
  const std::string missing = (dir / "absent.jsonl").string();
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip);
    EXPECT_EQ(read_error(empty, skip), empty + ": empty; expected JSON lines, a JSON array or PubMedQA's ori_pqal.json");
    EXPECT_EQ(read_error(text, skip),
              text + ": not JSON lines, a JSON array or PubMedQA's ori_pqal.json (line 2 starts with 'h')");
    EXPECT_EQ(read_error(spread, skip),
              spread + ": one JSON object spread over several lines; JSON lines need one record per line");
    EXPECT_EQ(read_error(other, skip),
              other +
                  ": a JSON object that is not PubMedQA's ori_pqal.json (no value is an object with \"QUESTION\"); "
                  "expected JSON lines, a JSON array or ori_pqal.json");
    EXPECT_TRUE(starts_with(read_error(broken_array, skip), broken_array + ":3: not valid JSON (parse error at byte 1: "))
        << read_error(broken_array, skip);
    // The error is at the string "a" (bytes 24..26 of line 3); nlohmann names the last byte it read.
    EXPECT_TRUE(starts_with(read_error(broken_dict, skip), broken_dict + ":3: not valid JSON (parse error at byte 26: "))
        << read_error(broken_dict, skip);
    EXPECT_NE(read_error(missing, skip).find(missing), std::string::npos) << read_error(missing, skip);
  }
}

TEST(QaReadErrors, SkipInvalidCountsAndListsInOrder) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "mixed.jsonl",
                                      "{\"question\": \"q1\", \"answer\": \"a1\"}\n"
                                      "{\"question\": \"q2\", \"answer\": \"a2\"\n"
                                      "{\"question\": \"q3\", \"answer\": \"a3\"}\n"
                                      "{\"question\": \"q4\"}\n"
                                      "{\"question\": \"q5\", \"answer\": \"a5\"}\n"
                                      "{\"question\": \"q6\", \"answer\": \"a6\"}\n"
                                      "{\"question\": \" \", \"answer\": \"a7\"}\n"
                                      "{\"question\": \"q8\", \"answer\": \"a8\"}\n");
  const std::string first_error = read_error(path);
  EXPECT_TRUE(starts_with(first_error, path + ":2: not valid JSON (parse error at byte ")) << first_error;

  lt::QaReadReport report;
  const auto recs = read(path, &report, true);
  EXPECT_EQ(report.format, "jsonl");
  EXPECT_EQ(report.records, 8);
  EXPECT_EQ(report.invalid, 3);
  std::vector<std::string> questions;
  for (const auto& r : recs) questions.push_back(r.question);
  EXPECT_EQ(questions, (std::vector<std::string>{"q1", "q3", "q5", "q6", "q8"}));
  ASSERT_EQ(report.problems.size(), 3u);
  EXPECT_TRUE(starts_with(report.problems[0], path + ":2: not valid JSON (parse error at byte ")) << report.problems[0];
  EXPECT_EQ(report.problems[1], path + ":4: missing field \"answer\"");
  EXPECT_EQ(report.problems[2], path + ":7: empty question");
}

// ---- prompt layouts -----------------------------------------------------------------------------

std::string training_text(int type, const std::string& q, const std::string& c, const std::string& a) {
  return lt::prompt_text(type, q, c) + a + lt::answer_suffix(type);
}

TEST(QaPrompt, GoldenStrings) {
  const std::string q = "Is aspirin effective?";
  const std::string c = "Aspirin was given to 10 patients.";
  const std::string a = "Yes, it helped.";
  EXPECT_EQ(training_text(1, q, c, a),
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nIs aspirin effective?\n\n"
            "### Input:\nAspirin was given to 10 patients.\n\n"
            "### Response:\nYes, it helped.");
  EXPECT_EQ(training_text(1, q, "", a),
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n"
            "### Instruction:\nIs aspirin effective?\n\n"
            "### Response:\nYes, it helped.");
  EXPECT_EQ(training_text(2, q, c, a),
            "<START_Q>Is aspirin effective? Aspirin was given to 10 patients.<END_Q><START_A>Yes, it helped.<END_A>");
  EXPECT_EQ(training_text(2, q, "", a), "<START_Q>Is aspirin effective?<END_Q><START_A>Yes, it helped.<END_A>");
  EXPECT_EQ(training_text(3, q, c, a),
            "<START_Q>Is aspirin effective?<END_Q><START_C>Aspirin was given to 10 patients.<END_C>"
            "<START_A>Yes, it helped.<END_A>");
  EXPECT_EQ(training_text(3, q, "", a),
            "<START_Q>Is aspirin effective?<END_Q><START_C><END_C><START_A>Yes, it helped.<END_A>");
  EXPECT_EQ(lt::answer_suffix(1), "");
  EXPECT_EQ(lt::answer_suffix(2), "<END_A>");
  EXPECT_EQ(lt::answer_suffix(3), "<END_A>");
}

TEST(QaPrompt, MarkersAndTypeCheck) {
  EXPECT_TRUE(lt::prompt_markers(1).empty());
  EXPECT_EQ(lt::prompt_markers(2), (std::vector<std::string>{"<START_Q>", "<END_Q>", "<START_A>", "<END_A>"}));
  EXPECT_EQ(lt::prompt_markers(3), (std::vector<std::string>{"<START_Q>", "<END_Q>", "<START_C>", "<END_C>",
                                                             "<START_A>", "<END_A>"}));
  // Every marker of a type occurs in its training text, so prepare's pieces cover them.
  for (int type : {2, 3})
    for (const auto& m : lt::prompt_markers(type))
      EXPECT_NE(training_text(type, "q", "c", "a").find(m), std::string::npos) << type << " " << m;
  for (int type : {1, 2, 3}) EXPECT_EQ(error_of([&] { lt::check_prompt_type(type); }), "<no error>");
  EXPECT_EQ(error_of([] { lt::check_prompt_type(0); }), "--prompt-type must be 1, 2 or 3 (got 0)");
  EXPECT_EQ(error_of([] { lt::check_prompt_type(4); }), "--prompt-type must be 1, 2 or 3 (got 4)");
  EXPECT_EQ(error_of([] { lt::prompt_text(4, "q", "c"); }), "--prompt-type must be 1, 2 or 3 (got 4)");
  EXPECT_EQ(error_of([] { lt::answer_suffix(-1); }), "--prompt-type must be 1, 2 or 3 (got -1)");
  EXPECT_EQ(error_of([] { lt::prompt_markers(7); }), "--prompt-type must be 1, 2 or 3 (got 7)");
}

// ---- prompt formats (PromptFormat) ---------------------------------------------------------------

TEST(QaPromptFormat, PromptTypesAreTheLayoutsOfBefore) {
  for (int type : {1, 2, 3}) {
    const auto f = lt::PromptFormat::from_prompt_type(type);
    EXPECT_EQ(f.prompt("q?", "c."), lt::prompt_text(type, "q?", "c.")) << type;
    EXPECT_EQ(f.prompt("q?", ""), lt::prompt_text(type, "q?", "")) << type;
    EXPECT_EQ(f.suffix(), lt::answer_suffix(type));
    EXPECT_EQ(f.markers(), lt::prompt_markers(type));
    EXPECT_EQ(f.prompt_type(), type);
  }
  EXPECT_EQ(lt::PromptFormat().name(), "alpaca");
  EXPECT_EQ(lt::PromptFormat::from_prompt_type(2).name(), "qa-inline-markers");
  EXPECT_EQ(lt::PromptFormat::from_prompt_type(3).name(), "qa-section-markers");
  EXPECT_EQ(error_of([] { lt::PromptFormat::from_prompt_type(4); }), "--prompt-type must be 1, 2 or 3 (got 4)");
}

TEST(QaPromptFormat, Llama2ChatGoldenStrings) {
  const auto f = lt::PromptFormat::llama2_chat("Be brief.");
  EXPECT_EQ(f.prompt("Is aspirin effective?", "Aspirin was given to 10 patients."),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nIs aspirin effective?\n\nAspirin was given to 10 patients. [/INST] ");
  EXPECT_EQ(f.prompt("Is aspirin effective?", ""), "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nIs aspirin effective? [/INST] ");
  EXPECT_EQ(f.suffix(), "");
  EXPECT_EQ(f.name(), "llama2-chat");
  EXPECT_EQ(f.prompt_type(), 0);
  EXPECT_EQ(f.markers(), (std::vector<std::string>{"[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"}));
  // --template llama2-chat without --system: the default system prompt.
  EXPECT_EQ(lt::PromptFormat::from_option("llama2-chat").prompt("q", ""),
            std::string("[INST] <<SYS>>\n") + lt::kLlama2ChatSystem + "\n<</SYS>>\n\nq [/INST] ");
  EXPECT_EQ(lt::PromptFormat::from_option("llama2-chat", "Be brief."), f);
}

TEST(QaPromptFormat, TemplatesSplitAtAnswer) {
  const auto f = lt::PromptFormat::from_template("Q: {question}\nC: {context}\nA: {answer}</s>{not a placeholder}");
  EXPECT_EQ(f.prompt("Why?", "Because."), "Q: Why?\nC: Because.\nA: ");
  EXPECT_EQ(f.suffix(), "</s>{not a placeholder}");
  EXPECT_EQ(f.name(), "template");
  EXPECT_TRUE(f.markers().empty());
  // {context} is optional, {question} may repeat, braces that are no placeholder are text.
  const auto g = lt::PromptFormat::from_template("{question} {} {a-b} {question}? {answer}");
  EXPECT_EQ(g.prompt("a", "ignored"), "a {} {a-b} a? ");
  EXPECT_EQ(g.suffix(), "");
  // The names of --template.
  EXPECT_EQ(lt::PromptFormat::from_option("qa-section-markers"), lt::PromptFormat::from_prompt_type(3));
  EXPECT_EQ(lt::PromptFormat::from_option("alpaca"), lt::PromptFormat());
}

TEST(QaPromptFormat, BadTemplatesAreRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Q: {question}", "--template: the template has no {answer}; it needs {question}, then {answer} once, e.g. "
                        "'Question: {question} Context: {context} Answer: {answer}'"},
      {"C: {context} A: {answer}", "--template: the template has no {question} before {answer}"},
      {"{question} {answer} {answer}",
       "--template: {answer} after {answer}; the prompt is the text before {answer}, and the text after it (the "
       "answer's suffix) takes no placeholder"},
      {"{answer} {question}",
       "--template: {question} after {answer}; the prompt is the text before {answer}, and the text after it (the "
       "answer's suffix) takes no placeholder"},
      {"{question} {system} {answer}",
       "--template: unknown placeholder {system} in the template; the placeholders are {question}, {context} and "
       "{answer}"},
      {"{Question} {answer}",
       "--template: unknown placeholder {Question} in the template; the placeholders are {question}, {context} and "
       "{answer}"},
      {"{question} \xff {answer}", "--template: the template is not valid UTF-8"},
  };
  for (const auto& [t, message] : cases) EXPECT_EQ(error_of([&] { lt::PromptFormat::from_template(t); }), message) << t;
  EXPECT_EQ(error_of([] { lt::PromptFormat::from_option(""); }),
            "--template: empty; give llama2-chat, @FILE or a template with {question} and {answer}");
  EXPECT_EQ(error_of([] { lt::PromptFormat::from_option("alpaca", "Be brief."); }),
            "--system is for --template llama2-chat (got --template 'alpaca')");
  // A mistyped name (one word, no braces) lists the names.
  for (const std::string name : {"llama-chat", "Alpaca", "qa_inline_markers"})
    EXPECT_EQ(error_of([&] { lt::PromptFormat::from_option(name); }),
              "--template '" + name + "': no such format; the names are llama2-chat, alpaca, qa-inline-markers, "
              "qa-section-markers (else @FILE, or a template with {question} and {answer})");
}

TEST(QaPromptFormat, TemplateFromAFileDropsOneTrailingNewline) {
  const auto dir = scratch_dir();
  const std::string path = write_file(dir, "t.txt", "### Q\n{question}\n### A\n{answer}\n");
  const auto f = lt::PromptFormat::from_option("@" + path);
  EXPECT_EQ(f.prompt("Why?", ""), "### Q\nWhy?\n### A\n");
  EXPECT_EQ(f.suffix(), "");
  const std::string bad = write_file(dir, "bad.txt", "{question}\n");
  EXPECT_EQ(error_of([&] { lt::PromptFormat::from_option("@" + bad); }),
            bad + ": the template has no {answer}; it needs {question}, then {answer} once, e.g. "
                  "'Question: {question} Context: {context} Answer: {answer}'");
  EXPECT_TRUE(starts_with(error_of([&] { lt::PromptFormat::from_option("@" + path + ".absent"); }), path + ".absent: "));
}

TEST(QaPromptFormat, StringFormRoundTrips) {
  const std::vector<lt::PromptFormat> formats = {
      lt::PromptFormat::from_prompt_type(1), lt::PromptFormat::from_prompt_type(2), lt::PromptFormat::from_prompt_type(3),
      lt::PromptFormat::llama2_chat(), lt::PromptFormat::llama2_chat("Say \"yes\" or \"no\".\nThen stop."),
      lt::PromptFormat::from_template("Q: {question}\n\"C\": {context}\\n A: {answer}<END>")};
  for (const auto& f : formats) {
    const std::string form = f.to_string();
    EXPECT_EQ(form.find('\n'), std::string::npos) << form;  // one line: an attribute, a log line
    const auto back = lt::PromptFormat::parse(form);
    EXPECT_EQ(back.to_string(), form);
    EXPECT_EQ(back.prompt("q", "c"), f.prompt("q", "c")) << form;
    EXPECT_EQ(back.suffix(), f.suffix()) << form;
    EXPECT_EQ(back.name(), f.name());
  }
  EXPECT_EQ(formats[0].to_string(), R"({"name":"alpaca"})");
  EXPECT_EQ(formats[4].to_string(), R"({"name":"llama2-chat","system":"Say \"yes\" or \"no\".\nThen stop."})");
  EXPECT_NE(formats[3], formats[4]);
  EXPECT_EQ(error_of([] { lt::PromptFormat::parse("alpaca"); }),
            "prompt format 'alpaca': expected a JSON object such as {\"name\":\"alpaca\"}");
  EXPECT_EQ(error_of([] { lt::PromptFormat::parse(R"({"name":"chatml"})"); }),
            "prompt format '{\"name\":\"chatml\"}': unknown name 'chatml'");
  EXPECT_EQ(error_of([] { lt::PromptFormat::parse(R"({"name":"template","template":"{question}"})"); }),
            "prompt format '{\"name\":\"template\",\"template\":\"{question}\"}': the template has no {answer}; it "
            "needs {question}, then {answer} once, e.g. 'Question: {question} Context: {context} Answer: {answer}'");
}

// ---- answer fields ------------------------------------------------------------------------------

TEST(QaAnswerField, TextsOfEachField) {
  auto make = [](const std::string& label) {
    lt::QaRecord r;
    r.origin = "f.json:" + (label.empty() ? std::string("unlabelled") : label);
    r.answer = "The trial found a benefit.";
    r.label = label;
    return r;
  };
  std::vector<lt::QaRecord> v = {make("yes"), make("maybe")};
  lt::select_answers(v, lt::AnswerField::kLongAnswer, false, nullptr);
  EXPECT_EQ(v[0].answer, "The trial found a benefit.");
  auto both = v;
  lt::select_answers(both, lt::AnswerField::kBoth, false, nullptr);
  EXPECT_EQ(both[0].answer, "The trial found a benefit.\nFinal decision: yes");
  EXPECT_EQ(both[1].answer, "The trial found a benefit.\nFinal decision: maybe");
  lt::select_answers(v, lt::AnswerField::kFinalDecision, false, nullptr);
  EXPECT_EQ(v[0].answer, "yes");
  EXPECT_EQ(v[1].answer, "maybe");
  // A record without a label: refused with its origin, or skipped and listed.
  std::vector<lt::QaRecord> w = {make("no"), make(""), make("yes")};
  auto copy = w;
  EXPECT_EQ(error_of([&] { lt::select_answers(copy, lt::AnswerField::kFinalDecision, false, nullptr); }),
            "f.json:unlabelled: no final_decision (yes, no or maybe) for --answer-field final_decision");
  lt::QaReadReport report;
  lt::select_answers(w, lt::AnswerField::kBoth, true, &report);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].answer, "The trial found a benefit.\nFinal decision: yes");
  EXPECT_EQ(report.invalid, 1);
  EXPECT_EQ(report.problems, (std::vector<std::string>{"f.json:unlabelled: no final_decision (yes, no or maybe) for --answer-field both"}));
  for (auto f : {lt::AnswerField::kLongAnswer, lt::AnswerField::kFinalDecision, lt::AnswerField::kBoth})
    EXPECT_EQ(lt::parse_answer_field(lt::answer_field_name(f)), f);
  EXPECT_EQ(error_of([] { lt::parse_answer_field("label"); }),
            "--answer-field label: expected final_decision, long_answer or both");
}

// ---- id lists -----------------------------------------------------------------------------------

TEST(QaIdList, ThreeFormsGiveTheSameIds) {
  const auto dir = scratch_dir();
  const auto a = lt::read_id_file(write_file(dir, "a.json", "[\"12\", 34, \"x y\", \"12\"]"));
  EXPECT_EQ(a.format, "json-array");
  EXPECT_EQ(a.ids, (std::vector<std::string>{"12", "34", "x y"}));  // each once, in file order
  const auto o = lt::read_id_file(write_file(dir, "o.json", "\xEF\xBB\xBF{\"34\": \"no\", \"12\": \" Yes\\n\", \"x y\": \"MAYBE\"}"));
  EXPECT_EQ(o.format, "json-object");
  EXPECT_EQ(o.ids, (std::vector<std::string>{"34", "12", "x y"}));
  EXPECT_EQ(o.labels, (std::vector<std::string>{"no", "yes", "maybe"}));  // trimmed, lower-cased
  // A label that is not a string, or not yes/no/maybe, is refused naming the id.
  const std::string number = write_file(dir, "number.json", "{\"1\": \"yes\", \"2\": 1}");
  EXPECT_EQ(error_of([&] { lt::read_id_file(number); }), number + ": the label of id '2' is number, not a string (yes, no or maybe)");
  const std::string null = write_file(dir, "null.json", "{\"7\": null}");
  EXPECT_EQ(error_of([&] { lt::read_id_file(null); }), null + ": the label of id '7' is null, not a string (yes, no or maybe)");
  const std::string other = write_file(dir, "other.json", "{\"7\": \"yes\", \"8\": \"perhaps\"}");
  EXPECT_EQ(error_of([&] { lt::read_id_file(other); }), other + ": the label of id '8' is 'perhaps', expected yes, no or maybe");
  const auto l = lt::read_id_file(write_file(dir, "l.txt", "\n  12 \r\n34\n\n\tx y\n12\n"));
  EXPECT_EQ(l.format, "lines");
  EXPECT_EQ(l.ids, (std::vector<std::string>{"12", "34", "x y"}));
  EXPECT_EQ(l.labels, (std::vector<std::string>{"", "", ""}));

  const std::string bad = write_file(dir, "bad.json", "[\"1\", 2.5]");
  EXPECT_EQ(error_of([&] { lt::read_id_file(bad); }), bad + ": element [1] is number, not an id (a string or an integer)");
  const std::string num = write_file(dir, "num.json", "[[\"1\"]]");
  EXPECT_EQ(error_of([&] { lt::read_id_file(num); }), num + ": element [0] is array, not an id (a string or an integer)");
  const std::string empty = write_file(dir, "empty.txt", "\n \n");
  EXPECT_EQ(error_of([&] { lt::read_id_file(empty); }), empty + ": no ids");
  const std::string broken = write_file(dir, "broken.json", "{\"1\": ");
  EXPECT_TRUE(starts_with(error_of([&] { lt::read_id_file(broken); }), broken + ": not valid JSON")) << error_of([&] { lt::read_id_file(broken); });
  EXPECT_TRUE(starts_with(error_of([&] { lt::read_id_file(dir.string() + "/absent"); }), dir.string() + "/absent: "));
}

// ---- curation -----------------------------------------------------------------------------------

int whitespace_tokens(const std::string& s) {
  int n = 0;
  bool in_token = false;
  for (char ch : s) {
    const bool space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
    if (!space && !in_token) ++n;
    in_token = !space;
  }
  return n;
}

lt::QaRecord rec(const std::string& origin, const std::string& q, const std::string& c, const std::string& a) {
  lt::QaRecord r;
  r.origin = origin;
  r.id = origin;
  r.question = q;
  r.context = c;
  r.answer = a;
  return r;
}

TEST(QaCurate, DuplicatesAndShortAnswers) {
  std::vector<lt::QaRecord> records = {
      rec("f:1", "What is X?", "Ctx one.", "X is a thing."),
      rec("f:2", "  what  is\tx? ", " ctx\tONE. ", "x IS a\nthing."),  // case/whitespace duplicate of f:1
      rec("f:3", "What is X?", "Ctx two.", "X is a thing."),            // different context: kept
      rec("f:4", "Short?", "", "Yes."),                                 // 1 token < 3
      rec("f:5", "short?", "", "yes."),  // also short; not a duplicate since f:4 was not kept
      rec("f:6", "a", ":b", "one two three"),
      rec("f:7", "a:", "b", "one two three"),  // same bytes split differently: not a duplicate of f:6
      rec("f:8", "What is X?", "Ctx one.", "X is a thing."),  // exact duplicate of f:1
      rec("f:9", "Two tokens?", "", "two tokens"),
  };
  lt::CurationOptions opt;
  opt.min_answer_tokens = 3;
  lt::CurationReport report;
  const auto kept = lt::curate(records, opt, whitespace_tokens, &report);
  std::vector<std::string> origins;
  for (const auto& r : kept) origins.push_back(r.origin);
  EXPECT_EQ(origins, (std::vector<std::string>{"f:1", "f:3", "f:6", "f:7"}));
  EXPECT_EQ(kept[0].question, "What is X?");  // the kept record is untouched
  EXPECT_EQ(report.input, 9);
  EXPECT_EQ(report.kept, 4);
  EXPECT_EQ(report.duplicates, 2);
  EXPECT_EQ(report.short_answers, 3);
  const std::vector<std::string> dropped = {
      "f:2: duplicate of f:1",
      "f:4: answer has 1 token, fewer than --min-answer-tokens 3",
      "f:5: answer has 1 token, fewer than --min-answer-tokens 3",
      "f:8: duplicate of f:1",
      "f:9: answer has 2 tokens, fewer than --min-answer-tokens 3",
  };
  EXPECT_EQ(report.dropped, dropped);
  EXPECT_EQ(report.to_json(), "{\"input\":9,\"kept\":4,\"dropped\":{\"duplicate\":2,\"short_answer\":3}}");
}

TEST(QaCurate, OnlyAsciiIsCaseFolded) {
  // "CAFÉ" and "cafÉ" differ only in ASCII case; "café" has a different (non-ASCII) letter.
  std::vector<lt::QaRecord> records = {
      rec("a", "CAF\xC3\x89?", "", "x"),
      rec("b", "caf\xC3\x89?", "", "x"),
      rec("c", "caf\xC3\xA9?", "", "x"),
  };
  lt::CurationReport report;
  const auto kept = lt::curate(records, lt::CurationOptions{}, whitespace_tokens, &report);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].origin, "a");
  EXPECT_EQ(kept[1].origin, "c");
  EXPECT_EQ(report.dropped, (std::vector<std::string>{"b: duplicate of a"}));
  EXPECT_EQ(report.to_json(), "{\"input\":3,\"kept\":2,\"dropped\":{\"duplicate\":1,\"short_answer\":0}}");
}

TEST(QaCurate, NoLengthLimitNeedsNoCounter) {
  std::vector<lt::QaRecord> records = {rec("a", "q", "", "x"), rec("b", "Q", "", "X")};
  lt::CurationOptions opt;
  opt.min_answer_tokens = 0;
  lt::CurationReport report;
  EXPECT_EQ(lt::curate(records, opt, nullptr, &report).size(), 1u);
  EXPECT_EQ(report.duplicates, 1);
  EXPECT_EQ(report.short_answers, 0);
  opt.min_answer_tokens = 1;
  EXPECT_NE(error_of([&] { lt::curate(records, opt, nullptr, &report); }), "<no error>");
}

// ---- UTF-8 --------------------------------------------------------------------------------------

TEST(QaUtf8, EdgeCases) {
  struct Case {
    std::string bytes;
    bool valid;
    const char* what;
  };
  const std::vector<Case> cases = {
      {"", true, "empty"},
      {"plain ASCII", true, "ASCII"},
      {std::string("a\0b", 3), true, "NUL is U+0000"},
      {"\x7F", true, "U+007F"},
      {"\xC2\x80", true, "U+0080, smallest 2-byte"},
      {"\xC3\xA9", true, "e acute"},
      {"\xDF\xBF", true, "U+07FF"},
      {"\xE0\xA0\x80", true, "U+0800, smallest 3-byte"},
      {"\xE2\x82\xAC", true, "euro sign"},
      {"\xED\x9F\xBF", true, "U+D7FF, just below the surrogates"},
      {"\xEE\x80\x80", true, "U+E000, just above the surrogates"},
      {"\xEF\xBF\xBF", true, "U+FFFF"},
      {"\xF0\x90\x80\x80", true, "U+10000, smallest 4-byte"},
      {"\xF0\x9F\x98\x80", true, "emoji"},
      {"\xF4\x8F\xBF\xBF", true, "U+10FFFF, the last code point"},
      {"\xC0\xAF", false, "overlong '/' (2 bytes)"},
      {"\xC1\xBF", false, "overlong U+007F"},
      {"\xE0\x80\xAF", false, "overlong '/' (3 bytes)"},
      {"\xE0\x9F\xBF", false, "overlong U+07FF"},
      {"\xF0\x80\x80\xAF", false, "overlong '/' (4 bytes)"},
      {"\xF0\x8F\xBF\xBF", false, "overlong U+FFFF"},
      {"\xED\xA0\x80", false, "U+D800 high surrogate"},
      {"\xED\xBF\xBF", false, "U+DFFF low surrogate"},
      {"\xED\xA0\xBD\xED\xB8\x80", false, "CESU-8 surrogate pair"},
      {"\xF4\x90\x80\x80", false, "U+110000"},
      {"\xF5\x80\x80\x80", false, "lead byte F5"},
      {"\xFF", false, "byte FF"},
      {"\xFE", false, "byte FE"},
      {"\x80", false, "stray continuation byte"},
      {"abc\xBF", false, "stray continuation after ASCII"},
      {"\xC3", false, "truncated 2-byte at end"},
      {"\xE2\x82", false, "truncated 3-byte at end"},
      {"\xF0\x9F\x98", false, "truncated 4-byte at end"},
      {"\xC3" "A", false, "lead byte followed by ASCII"},
      {"\xE2\x82" "A", false, "3-byte cut by ASCII"},
      {"\xC3\xA9\xA9", false, "one continuation too many"},
  };
  for (const auto& c : cases) EXPECT_EQ(lt::is_valid_utf8(c.bytes), c.valid) << c.what;
}

// ---- the real PubMedQA files --------------------------------------------------------------------

const std::string kOriPqal = lt::testing::kSharedData + "/ori_pqal.json";
const std::string kPqalJsonl = lt::testing::kSharedData + "/pubmedqa_pqal.jsonl";

bool exists(const std::string& path) { return std::ifstream(path).good(); }

bool has_non_ascii(const std::string& s) {
  for (char ch : s)
    if (static_cast<unsigned char>(ch) >= 0x80) return true;
  return false;
}

TEST(QaRealData, OriPqalLabelCounts) {
  if (!exists(kOriPqal)) GTEST_SKIP() << kOriPqal << " is absent (see ../shared/data/README.md)";
  lt::QaReadReport report;
  const auto recs = read(kOriPqal, &report);
  EXPECT_EQ(report.format, "pubmedqa-dict");
  EXPECT_EQ(report.records, 1000);
  EXPECT_EQ(report.invalid, 0);
  ASSERT_EQ(recs.size(), 1000u);
  std::map<std::string, int> labels;
  int non_ascii_contexts = 0, empty_contexts = 0;
  for (const auto& r : recs) {
    ++labels[r.label];
    non_ascii_contexts += has_non_ascii(r.context);
    empty_contexts += r.context.empty();
    EXPECT_TRUE(lt::is_valid_utf8(r.question) && lt::is_valid_utf8(r.context) && lt::is_valid_utf8(r.answer));
  }
  EXPECT_EQ(labels, (std::map<std::string, int>{{"yes", 552}, {"no", 338}, {"maybe", 110}}));
  EXPECT_EQ(non_ascii_contexts, 235);
  EXPECT_EQ(empty_contexts, 0);
  // File order, not sorted ids; the key is the id; CONTEXTS joined with " ".
  EXPECT_EQ(recs[0].id, "21645374");
  EXPECT_EQ(recs[1].id, "16418930");
  EXPECT_EQ(recs[0].origin, kOriPqal + ":21645374");
  EXPECT_EQ(recs[0].question, "Do mitochondria play a role in remodelling lace plant leaves during programmed cell death?");
  EXPECT_NE(recs[0].context.find("during PCD in plants. The following paper"), std::string::npos);
}

TEST(QaRealData, PqalJsonlMatchesOriPqal) {
  if (!exists(kOriPqal) || !exists(kPqalJsonl)) GTEST_SKIP() << "PubMedQA files absent from " << lt::testing::kSharedData;
  lt::QaReadReport report;
  const auto lines = read(kPqalJsonl, &report);
  EXPECT_EQ(report.format, "jsonl");
  EXPECT_EQ(report.records, 1000);
  EXPECT_EQ(report.invalid, 0);
  ASSERT_EQ(lines.size(), 1000u);
  const auto dict = read(kOriPqal);
  ASSERT_EQ(dict.size(), 1000u);
  int same_question = 0, same_answer = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    same_question += lines[i].question == dict[i].question;
    same_answer += lines[i].answer == dict[i].answer;
  }
  EXPECT_EQ(same_question, 1000);
  EXPECT_EQ(same_answer, 1000);
  EXPECT_EQ(lines[0].id, "line:1");
  EXPECT_EQ(lines[999].origin, kPqalJsonl + ":1000");
  EXPECT_EQ(lines[0].label, "");
  // The reference deployment joined the CONTEXTS with nothing between them.
  EXPECT_NE(lines[0].context.find("during PCD in plants.The following paper"), std::string::npos);
}

TEST(QaRealData, CurationOfOriPqal) {
  if (!exists(kOriPqal)) GTEST_SKIP() << kOriPqal << " is absent (see ../shared/data/README.md)";
  const auto recs = read(kOriPqal);
  lt::CurationReport report;
  lt::CurationOptions opt;
  EXPECT_EQ(lt::curate(recs, opt, whitespace_tokens, &report).size(), 1000u);
  EXPECT_EQ(report.duplicates, 0);
  EXPECT_EQ(report.short_answers, 0);
  // The shortest long answers have 8, 9 and 10 whitespace-separated words.
  opt.min_answer_tokens = 10;
  EXPECT_EQ(lt::curate(recs, opt, whitespace_tokens, &report).size(), 998u);
  EXPECT_EQ(report.short_answers, 2);
  EXPECT_EQ(report.to_json(), "{\"input\":1000,\"kept\":998,\"dropped\":{\"duplicate\":0,\"short_answer\":2}}");
}

}  // namespace
