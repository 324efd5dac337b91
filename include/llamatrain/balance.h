// Heterogeneity-aware splitting of a global batch over ranks.
//
// A step's global batch is M micro-batches of one shape; rank i runs k_i of them (sum k_i = M),
// with k_i proportional to a weight (its throughput). Gradients are summed over tokens and divided
// by the global count of loss tokens, so the update does not depend on the split.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lt {

enum class BalanceMode { kOff, kStatic, kAuto };
BalanceMode parse_balance_mode(const std::string& s);  // "off" | "static" | "auto"
const char* balance_mode_name(BalanceMode m);

// Splits `total` micro-batches over ranks in proportion to `weights` (>= 0, not all 0) by
// largest-remainder rounding: k_i = floor(total * w_i / sum w), then the leftover units go to the
// largest fractional parts (ties to the lower rank). When min_each > 0 every rank gets at least
// that many (total must allow it) and the rest is split by the weights.
std::vector<int> split_by_weights(int total, const std::vector<double>& weights, int min_each = 0);

// "w0,w1,...": one positive-or-zero number per rank; the error names the field at fault.
std::vector<double> parse_rank_weights(const std::string& s, int world_size);

// "RANK=FACTOR" (FACTOR >= 1): that rank's compute takes FACTOR times as long (a simulation of a
// slower device on one machine; the extra time is spent asleep).
struct Slowdown {
  int rank = -1;
  double factor = 1.0;
};
Slowdown parse_slowdown(const std::string& s, int world_size);

// The predicted time of a step: the slowest rank, k_i micro-batches of t_i seconds each.
double predicted_step_time(const std::vector<int>& k, const std::vector<double>& seconds_per_micro_batch);

// `auto`: from each rank's measured compute seconds per micro-batch, the split that equalises
// k_i * t_i (weights 1/t_i, at least one micro-batch each so every rank stays measured), and
// whether it is worth taking: the predicted step time falls by more than min_gain (0.03 = 3%).
struct Rebalance {
  std::vector<int> split;
  double predicted_now = 0, predicted_new = 0;
  bool take = false;
};
Rebalance propose_rebalance(const std::vector<int>& current, const std::vector<double>& seconds_per_micro_batch,
                            double min_gain = 0.03);

// `auto` over a run: each rank's compute seconds per micro-batch in every step since the last
// decision; a decision uses the median, so one disturbed step does not move the split. The first
// step (allocation, cold caches) is not measured; the first decision comes after the fifth step
// (four measured ones), later ones every `every` steps.
class AutoBalancer {
 public:
  AutoBalancer(int world_size, int64_t every);
  struct Decision {
    Rebalance rebalance;                          // rebalance.take: move to rebalance.split
    std::vector<double> seconds_per_micro_batch;  // the medians it used
  };
  // Step `step` (0-based) ran `split` and took compute_s[r] seconds on rank r; returns a decision
  // when one is due (std::nullopt otherwise).
  std::optional<Decision> observe(int64_t step, const std::vector<double>& compute_s, const std::vector<int>& split);

 private:
  std::vector<std::vector<double>> window_;  // (ranks, steps since the last decision)
  int64_t every_;
  int64_t next_decision_ = 5;                // in steps done
};

}  // namespace lt
