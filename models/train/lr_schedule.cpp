// The learning-rate schedules: see lr_schedule.h for the sources and the step convention.
#include "models/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>

namespace flowrun {

namespace {

bool is_transformers(const std::string& t) {
  return t == "constant" || t == "constant_with_warmup" || t == "linear" || t == "cosine";
}

// transformers' lr_lambda(k) for update k (0-based) of `total`, warmup W.
double transformers_factor(const std::string& type, int64_t k, int64_t W, int64_t total) {
  const double kd = static_cast<double>(k), Wd = static_cast<double>(std::max<int64_t>(W, 0));
  if (type == "constant") return 1.0;                      // get_constant_schedule: no warmup
  if (k < W) return kd / std::max(1.0, Wd);                // every warmup: k / max(1, W)
  if (type == "constant_with_warmup") return 1.0;
  const double progress = (kd - Wd) / std::max(1.0, static_cast<double>(total) - Wd);
  if (type == "linear") return std::max(0.0, 1.0 - progress);  // (total - k) / max(1, total - W)
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));  // cosine, num_cycles 0.5
}

}  // namespace

lr_schedule lr_schedule::transformers(const std::string& type, int64_t num_warmup_steps, int64_t num_training_steps) {
  if (!is_transformers(type))
    throw std::invalid_argument("lr_scheduler_type \"" + type +
                                "\" is not supported; use cosine, linear, constant or constant_with_warmup");
  lr_schedule s;
  s.type = type;
  s.warmup_num_steps = num_warmup_steps;
  s.total_num_steps = num_training_steps;
  return s;
}

double lr_schedule::lr_at(int64_t step, double base_lr) const {
  if (step < 0) throw std::invalid_argument("lr_schedule::lr_at: step " + std::to_string(step) + " < 0");
  if (type.empty()) return base_lr;
  if (is_transformers(type)) return base_lr * transformers_factor(type, step, warmup_num_steps, total_num_steps);
  // DeepSpeed's last_batch_iteration for the update that follows `step` applied updates
  const int64_t it = step - 1;
  const int64_t n = std::max<int64_t>(2, warmup_num_steps);
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(n));
  auto warmup_gamma = [&]() {
    return warmup_type == "linear" ? static_cast<double>(it) / static_cast<double>(n)
                                   : inverse_log_warm_up * std::log(static_cast<double>(it + 1));
  };
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    const double max_lr = (type == "WarmupLR" && warmup_max_lr_from_optimizer) ? base_lr : warmup_max_lr;
    if (it < 0) return warmup_min_lr;
    const double delta = max_lr - warmup_min_lr;
    double gamma;
    if (it < n) {
      gamma = warmup_gamma();
    } else if (type == "WarmupLR") {
      gamma = 1.0;
    } else {
      gamma = std::max(0.0, static_cast<double>(total_num_steps - it) /
                                std::max(1.0, static_cast<double>(total_num_steps - n)));
    }
    return warmup_min_lr + delta * gamma;
  }
  if (type == "WarmupCosineLR") {
    if (it < 0) return 0.0;  // get_lr() before the first step()
    double ratio;
    if (it < n) {
      ratio = warmup_min_ratio + warmup_gamma() * (1. - warmup_min_ratio);
    } else {
      const int64_t real_last_step = it - n + 1;
      const int64_t real_total_steps = std::max<int64_t>(1, total_num_steps - n);
      const double progress =
          std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
      ratio = (1 + std::cos(std::numbers::pi * progress)) / 2;
      ratio = std::max(0.0, cos_min_ratio + (1. - cos_min_ratio) * ratio);
    }
    return base_lr * ratio;
  }
  throw std::invalid_argument("lr_schedule: unknown scheduler type \"" + type +
                              "\" (transformers: cosine, linear, constant, constant_with_warmup; DeepSpeed: "
                              "WarmupLR, WarmupDecayLR, WarmupCosineLR)");
}

std::string lr_schedule::past_end(int64_t updates, double base_lr) const {
  if ((type != "WarmupDecayLR" && type != "WarmupCosineLR") || total_num_steps <= 0 || updates <= total_num_steps)
    return "";
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.3g", lr_at(updates - 1, base_lr));
  return "the DeepSpeed config's " + type + " is over at total_num_steps = " + std::to_string(total_num_steps) +
         ": the steps past it train at the schedule's end (learning rate " + lr + " at step " +
         std::to_string(updates) + ")";
}

std::string lr_schedule::all_warmup(int64_t updates, double base_lr) const {
  if (!is_transformers(type) || type == "constant" || updates <= 0 || warmup_num_steps < updates || !(base_lr > 0))
    return "";
  const double last = lr_at(updates - 1, base_lr);
  char lr[64];
  std::snprintf(lr, sizeof lr, "%.2e, %.0f%%", last, 100.0 * last / base_lr);
  return "num_warmup_steps = " + std::to_string(warmup_num_steps) + " and the run has " + std::to_string(updates) +
         " updates: every update is in warmup, the last at " + lr;
}

}  // namespace flowrun
