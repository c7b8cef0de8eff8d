// Rule-based ("verifiable") rewards: pure functions over text, for the
// reward_function node kind and its tests (issue 18).
//
// GSM8K (Cobbe et al. 2021): a reference answer ends with "#### N". The
// completion is scored by its own last "#### N" (the last marker with a number
// after it: a "#### Explanation" heading after the answer does not hide it),
// the convention of veRL's verl/utils/reward_score/gsm8k.py ("strict"
// extraction: the last match of "#### number"), with these differences:
//  - the whole completion is searched (veRL clips it to its last 300
//    characters for speed, which can cut the marker off a long answer);
//  - more spellings are read: no space or a tab after the marker ("####72"),
//    a leading '+' or '$', "42." and "42.0" (veRL compares the text, so
//    "42.0" is wrong there); a number must start with a digit after its sign
//    ("#### ,5" is no answer here, 5 in veRL);
//  - "1.5.2" is an answer but not a number: it matches no reference (as in
//    veRL), where reading it as 1.5 would have scored it right.
// Numbers compare after normalisation: thousands separators and a leading '+'
// or '$' dropped, and a decimal part of zeros ("42.0", "42.") removed, so
// "1,080" = "1080" and "42.0" = "42"; "-0" = "0". Nothing is parsed into a
// float, so large integers compare exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace flowrun::rlhf {

/// The canonical form of a number as written in an answer: "1,080" -> "1080",
/// "+42.50" -> "42.5", "$18" -> "18", "-0.0" -> "0". Empty when `text` (trimmed)
/// is not a number: optional sign, digits with optional ',' group separators,
/// optional '.' and digits.
std::string normalize_number(std::string_view text);

/// The number after the last "####" in `text` that has one (spaces after the
/// marker skipped), normalised; a run like "1.5.2" is returned as written (it
/// equals no normalised number); nullopt when no marker has a number after it.
std::optional<std::string> gsm8k_final_answer(std::string_view text);

/// The reference's answer: gsm8k_final_answer, or without a marker the whole
/// reference as a number; nullopt when it holds none ("The answer is 10",
/// "#### ten"), which no completion can match.
std::optional<std::string> gsm8k_reference_answer(std::string_view reference);

/// 1 when the completion's final answer equals the reference's
/// (gsm8k_final_answer, gsm8k_reference_answer), else 0. `format_score` (veRL's,
/// default 0) is given instead when the completion has a well-formed final
/// answer that is wrong, also against a reference without a number (veRL
/// compares the answer with the ground truth as given: it matches nothing, so
/// the answer is wrong, not unformatted).
double gsm8k_exact_match(std::string_view completion, std::string_view reference, double format_score = 0.0);

/// 1 when the completion ends with a final-answer line "#### N" (the marker
/// first on its line, after spaces or tabs at most; only whitespace after the
/// number), else 0: the format rule.
double final_answer_format(std::string_view completion);

/// DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to
/// max_length − cache_length tokens, then falling linearly to −1 at max_length,
/// and −1 beyond. length and the bounds in tokens; cache_length in
/// [0, max_length], max_length > 0.
double overlong_penalty(int64_t length, int64_t max_length, int64_t cache_length);

}  // namespace flowrun::rlhf
