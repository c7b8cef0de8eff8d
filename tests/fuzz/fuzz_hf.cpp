// Fuzz target: the Hugging Face folder reader (models/hf.h): config.json
// (hf_config_from_json: model_type llama, opt, gpt2 and their variants), the
// tensor map it implies, and, for a config of at most 2^20 parameters,
// load_hf on the folder with model.safetensors beside it.
//
// Input: parts separated by a line "%%": 0 config.json, 1 model.safetensors.
#include <cstdint>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "models/hf.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = fuzz::scratch_dir("hf");
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  const nlohmann::json j = nlohmann::json::parse(parts[0], nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  model_config cfg;
  try {
    cfg = hf_config_from_json(j);
    (void)cfg.summary();
    (void)hf_tensor_map(cfg);
  } catch (const std::runtime_error&) {
    return 0;
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (cfg.num_parameters() > (1 << 20) || parts.size() < 2) return 0;
  fuzz::write_file(dir / "config.json", parts[0]);
  fuzz::write_file(dir / "model.safetensors", parts[1]);
  try {
    decoder m = load_hf(dir.string());
    (void)m.num_parameters();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
