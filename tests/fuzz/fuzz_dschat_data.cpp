// Fuzz target: the DeepSpeed-Chat JSONL reader (models/rlhf/dschat_data.h load_source:
// {prompt, chosen, rejected}, {prompt, chosen} and raw HH-RLHF lines, plain or
// gzip), then the three steps' tokenization and batches on what it loaded, with
// the GPT-2 BPE tokenizer of tests/fixtures/bpe.
//
// Input: the file's bytes. Its first byte also picks the layout (automatic or
// one of the three) and the length limits, so short limits get exercised.
#include <cstdint>
#include <string>

#include "models/rlhf/dschat_data.h"
#include "models/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;
using namespace flowrun::dschat;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto tok =
      load_gpt2_bpe(FLOWRUN_FIXTURES_DIR "/bpe/vocab.json", FLOWRUN_FIXTURES_DIR "/bpe/merges.txt");
  const std::uint8_t knob = size ? data[0] : 0;
  const auto path = fuzz::scratch_dir("dschat_data") / "data.jsonl";
  fuzz::write_file(path, fuzz::as_text(data, size));
  const data_format formats[] = {data_format::automatic, data_format::prompt_chosen_rejected,
                                 data_format::prompt_chosen, data_format::hh_rlhf_raw};
  source src;
  try {
    src = load_source(path.string(), formats[knob & 3]);
  } catch (const std::runtime_error&) {
    return 0;  // a file with no usable line: refused, naming the file
  }
  (void)src.report.summary();

  tokenize_settings cfg;
  cfg.max_seq_len = 2 + (knob >> 2 & 15);
  cfg.max_prompt_seq_len = 1 + (knob >> 4 & 7);
  cfg.truncation = knob & 0x40 ? truncation_mode::prompt_start : truncation_mode::end;
  cfg.overflow = knob & 0x80 ? prompt_overflow::keep_end : prompt_overflow::drop;
  process_report rep;
  try {
    auto sft = make_sft_examples(src.rows, *tok, cfg, &rep);
    (void)rep.summary();
    if (!sft.empty()) (void)sft_batch(sft, {0, static_cast<std::int64_t>(sft.size() - 1)}, knob & 1);
  } catch (const std::invalid_argument&) {
  }
  try {
    auto rm = make_rm_examples(src.rows, *tok, cfg, &rep);
    if (!rm.empty()) (void)rm_batch(rm, {static_cast<std::int64_t>(rm.size() - 1), 0});
  } catch (const std::invalid_argument&) {
  }
  try {
    auto pr = make_prompt_examples(src.rows, *tok, cfg, &rep);
    if (!pr.empty()) (void)prompt_batch(pr, {0});
  } catch (const std::invalid_argument&) {
  }
  std::vector<source> sources;
  sources.push_back(std::move(src));
  for (int step = 0; step < 3; ++step) (void)rows_for_step(sources, step, split_settings{});
  return 0;
}
