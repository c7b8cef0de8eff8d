// Fuzz target: the PEFT LoRA adapter reader (models/adapter.h load_adapter:
// adapter_config.json's peft_type, r, lora_alpha, lora_dropout, target_modules,
// and adapter_model.safetensors' names and shapes) onto the tiny LLaMA of
// tests/fixtures/hf/llama.
//
// Input: parts separated by a line "%%": 0 adapter_config.json,
// 1 adapter_model.safetensors.
#include <cstdint>
#include <stdexcept>

#include "models/adapter.h"
#include "models/hf.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const decoder base = load_hf(FLOWRUN_FIXTURES_DIR "/hf/llama");
  const auto& dir = fuzz::scratch_dir("adapter");
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  fuzz::write_file(dir / "adapter_config.json", parts[0]);
  fuzz::write_file(dir / "adapter_model.safetensors", parts.size() > 1 ? parts[1] : std::string_view{});
  decoder m = clone_decoder(base);
  try {
    load_adapter(m, dir.string(), (size & 1) != 0);
    (void)m.num_adapter_parameters();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
