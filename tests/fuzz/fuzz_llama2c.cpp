// Fuzz target: the llama2.c checkpoint reader (models/llama2c.h load_llama2c:
// the legacy v0 header of 7 int32 and the 256-byte version-1 header, sizes
// checked against the file's length before the weights are read).
//
// Input: the file's bytes.
#include <cstdint>
#include <stdexcept>

#include "models/llama2c.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz::scratch_dir("llama2c") / "model.bin";
  fuzz::write_file(path, fuzz::as_text(data, size));
  try {
    decoder m = load_llama2c(path.string());
    (void)m.num_parameters();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
