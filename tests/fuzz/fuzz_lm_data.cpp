// Fuzz target: the LM text reader (models/lm_data.h lm_dataset: documents split
// at blank lines, tokenized with BOS, cut into seq_length + 1 instances, a
// held-out share), then training and validation batches, with the GPT-2 BPE
// tokenizer of tests/fixtures/bpe.
//
// Input: the text file's bytes; its first byte also picks seq_length (1..16).
#include <cstdint>
#include <stdexcept>

#include "models/lm_data.h"
#include "models/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto tok =
      load_gpt2_bpe(FLOWRUN_FIXTURES_DIR "/bpe/vocab.json", FLOWRUN_FIXTURES_DIR "/bpe/merges.txt");
  const std::uint8_t knob = size ? data[0] : 0;
  const auto text = fuzz::as_text(data, size);
  (void)split_documents(std::string(text));
  const auto path = fuzz::scratch_dir("lm_data") / "text.txt";
  fuzz::write_file(path, text);
  try {
    lm_dataset ds(path.string(), *tok, 1 + (knob & 15), (knob >> 4) / 16.0);
    tensor ids, targets;
    const std::int64_t B = 1 + (knob >> 6);
    for (int i = 0; i < 3; ++i) ds.next_batch(B, ids, targets);
    ds.val_batch(0, B, ids, targets);
    ds.val_batch(5, B, ids, targets);
    ds.set_position(ds.epoch(), ds.cursor());
  } catch (const std::runtime_error&) {  // too short for one training and one validation instance
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
