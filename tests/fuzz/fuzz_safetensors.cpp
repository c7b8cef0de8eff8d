// Fuzz target: the safetensors reader (models/safetensors.h safetensors_file:
// the 8-byte length, the JSON header, dtypes, shapes and data_offsets), then
// every tensor read as f32 and a sharded checkpoint folder
// (model.safetensors.index.json) that maps names to the file.
//
// Input: parts separated by a line "%%": 0 the .safetensors file's bytes,
// 1 (optional) model.safetensors.index.json naming "model.safetensors".
#include <cstdint>
#include <stdexcept>

#include "models/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = fuzz::scratch_dir("safetensors");
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  const auto file = dir / "model.safetensors";
  fuzz::write_file(file, parts[0]);
  try {
    safetensors_file f(file.string());
    (void)f.metadata();
    for (const auto& e : f.entries()) {
      try {
        tensor t = f.read(e.name);
        (void)t;
      } catch (const std::runtime_error&) {
      }
    }
  } catch (const std::runtime_error&) {
  }
  const auto index = dir / "model.safetensors.index.json";
  std::error_code ec;
  std::filesystem::remove(index, ec);
  if (parts.size() > 1) fuzz::write_file(index, parts[1]);
  try {
    safetensors_checkpoint ck(dir.string());
    for (const auto& name : ck.names()) {
      try {
        (void)ck.file_of(name);
        (void)ck.read(name);
      } catch (const std::runtime_error&) {
      }
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
