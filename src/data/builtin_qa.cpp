#include "llamatrain/builtin_qa.h"

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/rng.h"

namespace lt {

namespace {

using Words = std::vector<const char*>;

// Word lists. Colours, objects and places are disjoint from each other and from the template
// words, so an item ("red ball") or a place ("kitchen") can be matched as a whole word sequence.
const Words& names() {
  static const Words w = {"Tom", "Mia", "Sam", "Ben", "Lily", "Anna", "Max", "Lucy", "Tim", "Sara"};
  return w;
}
const Words& colours() {
  static const Words w = {"red", "blue", "green", "yellow", "black", "white", "pink", "brown"};
  return w;
}
const Words& objects() {
  static const Words w = {"ball", "kite", "hat", "cup", "book", "box", "key", "bag", "drum", "lamp", "shoe", "coat"};
  return w;
}
const Words& places() {
  static const Words w = {"kitchen", "garden", "barn", "shed", "attic", "car", "school", "park", "bedroom", "boat"};
  return w;
}

struct Fact {
  int name, colour, object, place, form;
};

std::string item_text(int colour, int object) {
  return std::string(colours()[size_t(colour)]) + " " + objects()[size_t(object)];
}

// Three sentence forms of "the item is in the place"; all of them answer the question.
std::string fact_sentence(const Fact& f) {
  const std::string item = item_text(f.colour, f.object), place = places()[size_t(f.place)];
  const std::string who = names()[size_t(f.name)];
  switch (f.form) {
    case 0: return who + " keeps the " + item + " in the " + place + ".";
    case 1: return who + " left the " + item + " in the " + place + ".";
    default: return "The " + item + " is in the " + place + ".";
  }
}

// Two question shapes with the same meaning.
std::string question_text(int shape, int colour, int object, int place) {
  const std::string item = item_text(colour, object), where = places()[size_t(place)];
  if (shape == 0) return "Is the " + item + " in the " + where + "?";
  return "Can we find the " + item + " in the " + where + "?";
}

// k distinct values of [0, n), in random order.
std::vector<int> distinct(int n, int k, Rng& rng) {
  std::vector<int> all(size_t(n), 0);
  for (int i = 0; i < n; ++i) all[size_t(i)] = i;
  shuffle(all, rng);
  all.resize(size_t(k));
  return all;
}

enum Label { kYes = 0, kNo = 1, kMaybe = 2 };
constexpr std::array<const char*, 3> kLabelWord = {"yes", "no", "maybe"};
// Per block of 20 records: 9 yes, 7 no, 4 maybe.
constexpr int kBlock = 20;
constexpr std::array<int, 3> kQuota = {9, 7, 4};

struct Example {
  std::string question, context, answer;
};

Example make_example(Label label, Rng& rng) {
  const int n_colours = int(colours().size()), n_objects = int(objects().size());
  const int n_places = int(places().size()), n_names = int(names().size());
  const int n_facts = 2 + int(rng.below(2));
  // Distinct people, places, colours and objects within one context, so every sentence is
  // unambiguous and either word of an item names it.
  const std::vector<int> who = distinct(n_names, n_facts, rng);
  const std::vector<int> where = distinct(n_places, n_facts + 1, rng);  // last: unmentioned
  const std::vector<int> cols = distinct(n_colours, n_facts + 1, rng);  // last: unmentioned
  const std::vector<int> objs = distinct(n_objects, n_facts + 1, rng);
  std::vector<int> items;
  for (int i = 0; i <= n_facts; ++i) items.push_back(cols[size_t(i)] * n_objects + objs[size_t(i)]);
  std::vector<Fact> facts;
  for (int i = 0; i < n_facts; ++i)
    facts.push_back({who[size_t(i)], items[size_t(i)] / n_objects, items[size_t(i)] % n_objects,
                     where[size_t(i)], int(rng.below(3))});
  Example ex;
  for (int i = 0; i < n_facts; ++i) {
    if (i) ex.context += " ";
    ex.context += fact_sentence(facts[size_t(i)]);
  }
  const int shape = int(rng.below(2));
  if (label == kMaybe) {
    // An item the context never mentions (neither its colour nor its object), asked about any
    // place (mentioned or not), so the place alone does not give the answer away.
    const int item = items.back(), colour = item / n_objects, object = item % n_objects;
    const int place = int(rng.below(uint64_t(n_places)));
    ex.question = question_text(shape, colour, object, place);
    ex.answer = "The context does not say where the " + item_text(colour, object) + " is.";
    return ex;
  }
  const Fact& asked = facts[size_t(rng.below(uint64_t(n_facts)))];
  int place = asked.place;
  if (label == kNo) {
    // Half the time a place the context gives to another item (to answer, find the asked item's
    // sentence and compare places), half the time a place the context never mentions (the item is
    // placed elsewhere, so it is not there: an easier inference a small model learns first).
    if (rng.below(2) == 0) {
      int other = int(rng.below(uint64_t(n_facts - 1)));
      if (&facts[size_t(other)] >= &asked) ++other;
      place = facts[size_t(other)].place;
    } else {
      place = where[size_t(n_facts)];  // drawn distinct from every mentioned place
    }
  }
  ex.question = question_text(shape, asked.colour, asked.object, place);
  // The evidence, then the place the question asks about: the decision compares the two places,
  // which are then a fixed number of tokens before it (docs/benchmarks.md, "The quick start").
  ex.answer = fact_sentence(asked) + " The question asks about the " + places()[size_t(place)] + ".";
  return ex;
}

}  // namespace

std::string builtin_qa_jsonl(int n_examples, uint64_t seed) {
  Rng rng(seed);
  std::string out;
  if (n_examples <= 0) return out;
  out.reserve(size_t(n_examples) * 300);
  std::set<std::pair<std::string, std::string>> seen;  // (question, context): no duplicates
  std::vector<Label> block;
  for (int n = 0; n < n_examples; ++n) {
    if (n % kBlock == 0) {
      block.clear();
      for (int l = 0; l < 3; ++l) block.insert(block.end(), size_t(kQuota[size_t(l)]), Label(l));
      shuffle(block, rng);
    }
    const Label label = block[size_t(n % kBlock)];
    Example ex = make_example(label, rng);
    // The space of contexts is in the billions, so a repeat is rare and a redraw ends it.
    while (!seen.emplace(ex.question, ex.context).second) ex = make_example(label, rng);
    nlohmann::ordered_json rec;
    rec["id"] = "factqa-" + std::to_string(n + 1);
    rec["question"] = ex.question;
    rec["context"] = ex.context;
    rec["answer"] = ex.answer;
    rec["final_decision"] = kLabelWord[size_t(label)];
    out += rec.dump();
    out += '\n';
  }
  return out;
}

std::optional<std::string> builtin_qa_source(const std::string& source) {
  if (source == kBuiltinQaName) return builtin_qa_jsonl();
  const std::string prefix = std::string(kBuiltinQaName) + ":";
  if (source.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string count = source.substr(prefix.size());
  const bool digits = !count.empty() && count.size() <= 7 &&
                      std::all_of(count.begin(), count.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(count) : 0;
  if (n < 20 || n > 1000000)
    fail(strcat(source, ": expected ", kBuiltinQaName, " or ", prefix, "N with N records, 20 <= N <= 1000000"));
  return builtin_qa_jsonl(n);
}

}  // namespace lt
