#include "llamatrain/builtin_corpus.h"

#include <vector>

#include "llamatrain/rng.h"

namespace lt {

namespace {

using Words = std::vector<const char*>;

const char* pick(const Words& w, Rng& rng) { return w[size_t(rng.below(w.size()))]; }

}  // namespace

std::string builtin_corpus(int n_stories, uint64_t seed) {
  // A tiny story grammar in the spirit of TinyStories: enough structure (names repeat within a
  // story, sentences follow a plot) for a small model to learn something measurable.
  static const Words names = {"Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Sam", "Lucy", "Tim"};
  static const Words animals = {"cat", "dog", "bird", "fox", "bunny", "frog", "duck", "bear", "mouse", "fish"};
  static const Words adjectives = {"little", "happy", "small", "brave", "kind", "shy", "funny", "big"};
  static const Words places = {"park", "garden", "forest", "house", "pond", "hill", "beach", "farm"};
  static const Words things = {"ball", "red box", "shiny stone", "kite", "blue hat", "book", "cake", "flower"};
  static const Words likes = {"play", "run", "sing", "jump", "read", "dance", "swim", "paint"};
  static const Words feelings = {"happy", "sad", "surprised", "excited", "scared", "proud"};
  static const Words endings = {
      "They played together until the sun went down.", "From that day on, they were best friends.",
      "Everyone laughed and had a good day.", "Then they went home and had a nice dinner.",
      "It was the best day ever."};
  Rng rng(seed);
  std::string out;
  out.reserve(size_t(n_stories) * 420);
  for (int s = 0; s < n_stories; ++s) {
    const std::string name = pick(names, rng), friend_name = pick(names, rng);
    const std::string animal = pick(animals, rng), place = pick(places, rng), thing = pick(things, rng);
    const std::string like = pick(likes, rng), feeling = pick(feelings, rng);
    out += "Once upon a time, there was a ";
    out += pick(adjectives, rng);
    out += " " + animal + " named " + name + ". ";
    out += name + " liked to " + like + " in the " + place + ". ";
    out += "One day, " + name + " found a " + thing + " in the " + place + ". ";
    out += name + " was very " + feeling + ". ";
    if (rng.below(2) == 0) {
      out += name + " showed the " + thing + " to " + friend_name + ". ";
      out += friend_name + " said, \"Let's " + like + " with the " + thing + "!\" ";
    } else {
      out += name + " wanted to share the " + thing + " with a friend. ";
      out += "So " + name + " went to find " + friend_name + ". ";
    }
    out += pick(endings, rng);
    out += "\n\n";
  }
  return out;
}

}  // namespace lt
