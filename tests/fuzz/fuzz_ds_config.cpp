// Fuzz target: the DeepSpeed JSON reader (models/train/ds_config.h parse_ds_config:
// batch-size triple, zero_optimization, fp16/bf16, optimizer, scheduler,
// "auto" values, key=value overrides), then the loss scaler and the LR schedule
// it describes.
//
// Input: the JSON text. Its first byte also picks the world size (1..4).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "models/train/ds_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint8_t knob = size ? data[0] : 0;
  const std::string text(fuzz::as_text(data, size));
  ds_parse_options opt;
  if (knob & 4) opt.overrides["train_micro_batch_size_per_gpu"] = "2";
  if (knob & 8) opt.overrides["scheduler.type"] = "WarmupLR";
  if (knob & 16) opt.auto_values["train_batch_size"] = "8";
  try {
    const ds_config cfg = parse_ds_config(text, 1 + (knob & 3), "ds_config.json", opt);
    (void)cfg.summary();
    (void)cfg.ignored_keys_warning();
    for (std::int64_t step : {0, 1, 7, 1000, 1 << 30}) (void)cfg.lr_at(step);
    dynamic_loss_scaler scaler(cfg);
    for (int i = 0; i < 8; ++i) (void)scaler.update(((knob >> 5) >> (i % 3)) & 1);
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
