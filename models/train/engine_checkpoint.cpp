#include "models/train/engine_checkpoint.h"

#include "models/adapter.h"
#include "models/config.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace flowrun {

std::vector<shard_group> engine_state_groups(const zero_engine& eng, const decoder& model, int rank,
                                             shard_manifest& m) {
  m.zero_stage = eng.settings().stage;
  m.extra["optimizer_steps"] = eng.step_count();
  // the model the groups hold, so that the checkpoint alone rebuilds it (flowrun convert --from zero, generate
  // --zero_checkpoint): its config (flowrun's keys, the RoPE layout included), its LoRA adapter's and whether
  // a value head is in the adapter group
  m.extra["model_config"] = nlohmann::json(model.config());
  if (model.has_lora()) m.extra["lora_config"] = lora_config_record(model.lora());
  m.extra["value_head"] = model.has_value_head();
  if (const auto& ls = eng.settings().loss_scaler) {
    m.loss_scale = ls->scale();
    m.loss_scale_good_steps = ls->good_steps();
    m.extra["loss_scale_hysteresis_left"] = ls->hysteresis_left();
  }
  std::vector<shard_group> groups;
  if (model.base_trainable()) {
    shard_group g;
    g.name = "base";
    g.full_numel = model.num_parameters();
    for (auto& [lo, hi] : eng.owned_ranges()) g.ranges.push_back({lo, hi});
    g.tensors["fp32_master"] = eng.owned_params();
    if (auto t = eng.owned_exp_avg(); t.defined()) g.tensors["exp_avg"] = t;
    if (auto t = eng.owned_exp_avg_sq(); t.defined()) g.tensors["exp_avg_sq"] = t;
    groups.push_back(std::move(g));
  }
  if (model.num_adapter_parameters() > 0) {  // replicated: rank 0 saves it, the others list it empty
    shard_group g;
    g.name = "adapter";
    g.full_numel = model.num_adapter_parameters();
    // every rank's manifest names the same groups and tensors (load_shard_checkpoint checks it):
    // rank 0's range is the whole adapter, the others hold no range and 0-element tensors
    auto part = [rank](const tensor& t) { return rank == 0 ? t : tensor::empty({0}, t.type(), t.dev()); };
    if (rank == 0) g.ranges.push_back({0, g.full_numel});
    g.tensors["fp32_master"] = part(rank == 0 ? eng.adapter_params().clone() : eng.adapter_params());
    if (auto t = eng.adapter_exp_avg(); t.numel() > 0) g.tensors["exp_avg"] = part(t);
    if (auto t = eng.adapter_exp_avg_sq(); t.numel() > 0) g.tensors["exp_avg_sq"] = part(t);
    groups.push_back(std::move(g));
  }
  return groups;
}

std::string trainer_config_hash(const decoder& model) {
  nlohmann::json j = model.config();
  j["lora"] = model.has_lora();
  j["value_head"] = model.has_value_head();
  j["base_trains"] = model.base_trainable();
  return config_fingerprint(j);
}

std::string weights_fingerprint(const decoder& model) {
  std::string sampled;  // per tensor: its element count, then at most 2^20 elements at an even stride
  auto add = [&sampled](const tensor& t) {
    if (!t.defined()) return;
    const tensor host = t.dev().kind == device_kind::cpu ? t : t.to(device::cpu());
    const int64_t n = host.numel();
    const size_t esz = dtype_size(host.type());
    sampled.append(reinterpret_cast<const char*>(&n), sizeof n);
    const int64_t stride = std::max<int64_t>(1, n >> 20);
    const auto* bytes = static_cast<const char*>(host.raw());
    for (int64_t i = 0; i < n; i += stride) sampled.append(bytes + static_cast<size_t>(i) * esz, esz);
  };
  add(model.w().flat);
  if (model.has_value_head()) add(model.w().v_head);
  return bytes_fingerprint(sampled);
}

tensor checkpoint_tensor(const loaded_checkpoint& ck, std::string_view group, std::string_view name) {
  auto gi = ck.full.find(std::string(group));
  if (gi == ck.full.end()) return {};
  auto ti = gi->second.find(std::string(name));
  return ti == gi->second.end() ? tensor{} : ti->second;
}

void restore_engine_state(zero_engine& eng, const loaded_checkpoint& ck) {
  const auto& m0 = ck.manifests.at(0);
  auto get = [&](const char* g, const char* t) { return checkpoint_tensor(ck, g, t); };
  eng.restore(get("base", "fp32_master"), get("base", "exp_avg"), get("base", "exp_avg_sq"),
              get("adapter", "fp32_master"), get("adapter", "exp_avg"), get("adapter", "exp_avg_sq"),
              m0.extra.value("optimizer_steps", m0.step));
  if (const auto& ls = eng.settings().loss_scaler; ls && m0.loss_scale > 0)
    ls->restore(m0.loss_scale, m0.loss_scale_good_steps, m0.extra.value("loss_scale_hysteresis_left", int64_t{0}));
}

}  // namespace flowrun
