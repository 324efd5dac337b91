#include "llamatrain/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "llamatrain/error.h"

namespace lt {

BalanceMode parse_balance_mode(const std::string& s) {
  if (s == "off") return BalanceMode::kOff;
  if (s == "static") return BalanceMode::kStatic;
  if (s == "auto") return BalanceMode::kAuto;
  fail(strcat("--balance ", s, ": expected off, static or auto"));
}

const char* balance_mode_name(BalanceMode m) {
  switch (m) {
    case BalanceMode::kOff: return "off";
    case BalanceMode::kStatic: return "static";
    case BalanceMode::kAuto: return "auto";
  }
  return "?";
}

std::vector<int> split_by_weights(int total, const std::vector<double>& weights, int min_each) {
  const int n = int(weights.size());
  LT_CHECK(n > 0, "split over no ranks");
  LT_CHECK(total >= min_each * n, "cannot give ", n, " ranks ", min_each, " of ", total, " micro-batches each");
  double sum = 0;
  for (double w : weights) {
    LT_CHECK(std::isfinite(w) && w >= 0, "bad weight ", w);
    sum += w;
  }
  LT_CHECK(sum > 0, "all weights are zero");
  std::vector<int> k(size_t(n), min_each);
  const int rest = total - min_each * n;
  std::vector<double> frac(static_cast<size_t>(n));
  int given = 0;
  for (int i = 0; i < n; ++i) {
    const double exact = double(rest) * weights[size_t(i)] / sum;
    const int whole = int(std::floor(exact));
    k[size_t(i)] += whole;
    given += whole;
    frac[size_t(i)] = exact - whole;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac[size_t(a)] > frac[size_t(b)]; });
  for (int j = 0; given < rest; ++j, ++given) ++k[size_t(order[size_t(j % n)])];
  return k;
}

std::vector<double> parse_rank_weights(const std::string& s, int world_size) {
  std::vector<double> w;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    const std::string field = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double x = std::strtod(field.c_str(), &end);
    if (field.empty() || *end != '\0' || !std::isfinite(x) || x < 0)
      fail(strcat("--rank-weights ", s, ": field ", w.size() + 1, " (\"", field, "\") is not a number >= 0"));
    w.push_back(x);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (int(w.size()) != world_size)
    fail(strcat("--rank-weights ", s, ": ", w.size(), " weights for ", world_size, " ranks; give one per rank"));
  if (std::accumulate(w.begin(), w.end(), 0.0) <= 0) fail(strcat("--rank-weights ", s, ": all weights are 0"));
  return w;
}

Slowdown parse_slowdown(const std::string& s, int world_size) {
  const size_t eq = s.find('=');
  Slowdown d;
  char* end = nullptr;
  if (eq != std::string::npos) {
    const std::string r = s.substr(0, eq), f = s.substr(eq + 1);
    const long rank = std::strtol(r.c_str(), &end, 10);
    const bool rank_ok = !r.empty() && *end == '\0';
    const double factor = std::strtod(f.c_str(), &end);
    const bool factor_ok = !f.empty() && *end == '\0' && std::isfinite(factor);
    if (rank_ok && factor_ok) {
      if (rank < 0 || rank >= world_size)
        fail(strcat("--simulate-slowdown ", s, ": rank ", rank, " is not in [0, ", world_size, ")"));
      if (factor < 1) fail(strcat("--simulate-slowdown ", s, ": factor ", factor, " must be >= 1"));
      d.rank = int(rank);
      d.factor = factor;
      return d;
    }
  }
  fail(strcat("--simulate-slowdown ", s, ": expected RANK=FACTOR, e.g. 1=2"));
}

double predicted_step_time(const std::vector<int>& k, const std::vector<double>& t) {
  double worst = 0;
  for (size_t i = 0; i < k.size(); ++i) worst = std::max(worst, double(k[i]) * t[i]);
  return worst;
}

Rebalance propose_rebalance(const std::vector<int>& current, const std::vector<double>& t, double min_gain) {
  Rebalance r;
  const int total = std::accumulate(current.begin(), current.end(), 0);
  std::vector<double> speed(t.size());
  for (size_t i = 0; i < t.size(); ++i) speed[i] = t[i] > 0 ? 1.0 / t[i] : 0.0;
  r.predicted_now = predicted_step_time(current, t);
  const int n = int(t.size());
  if (total < n || std::all_of(speed.begin(), speed.end(), [](double x) { return x == 0; })) {
    r.split = current;
    r.predicted_new = r.predicted_now;
    return r;
  }
  r.split = split_by_weights(total, speed, 1);
  // Largest-remainder rounding of k_i ∝ speed_i can leave a unit where it costs most; moving
  // single units from the rank that finishes last to the one that would finish first while it
  // helps gives the best integer split.
  for (int iter = 0; iter < total; ++iter) {
    int worst = 0, best = -1;
    for (int i = 0; i < n; ++i)
      if (r.split[size_t(i)] * t[size_t(i)] > r.split[size_t(worst)] * t[size_t(worst)]) worst = i;
    double best_after = 1e300;
    for (int i = 0; i < n; ++i) {
      const double after = (r.split[size_t(i)] + 1) * t[size_t(i)];
      if (i != worst && after < best_after) best_after = after, best = i;
    }
    if (best < 0 || r.split[size_t(worst)] <= 1) break;
    if (best_after >= r.split[size_t(worst)] * t[size_t(worst)]) break;
    --r.split[size_t(worst)];
    ++r.split[size_t(best)];
  }
  r.predicted_new = predicted_step_time(r.split, t);
  r.take = r.split != current && r.predicted_new < (1.0 - min_gain) * r.predicted_now;
  return r;
}

AutoBalancer::AutoBalancer(int world_size, int64_t every) : window_(size_t(world_size)), every_(every) {}

std::optional<AutoBalancer::Decision> AutoBalancer::observe(int64_t step, const std::vector<double>& compute_s,
                                                            const std::vector<int>& split) {
  const size_t W = window_.size();
  if (step > 0)
    for (size_t r = 0; r < W; ++r)
      if (split[r] > 0) window_[r].push_back(compute_s[r] / split[r]);
  if (step + 1 < next_decision_ || window_[0].empty()) return std::nullopt;
  Decision d;
  d.seconds_per_micro_batch.resize(W);
  for (size_t r = 0; r < W; ++r) {
    std::vector<double> v = window_[r];
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    d.seconds_per_micro_batch[r] = n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  d.rebalance = propose_rebalance(split, d.seconds_per_micro_batch);
  for (auto& w : window_) w.clear();
  next_decision_ = step + 1 + every_;
  return d;
}

}  // namespace lt
