// Rule-based rewards: definitions and sources in rule_rewards.h.
#include "models/rlhf/rule_rewards.h"

#include <stdexcept>

namespace flowrun::rlhf {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The length of the number at the start of s (sign, '$', digits, ',' groups, '.', digits), 0 if none.
std::size_t number_length(std::string_view s) {
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i < s.size() && s[i] == '$') ++i;
  const std::size_t digits_from = i;
  while (i < s.size() && (is_digit(s[i]) || (s[i] == ',' && i + 1 < s.size() && is_digit(s[i + 1]) && i > digits_from)))
    ++i;
  if (i == digits_from) return 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
  }
  return i;
}

}  // namespace

std::string normalize_number(std::string_view text) {
  const std::string_view s = trim(text);
  if (s.empty() || number_length(s) != s.size()) return {};
  std::string sign, whole, frac;
  std::size_t i = 0;
  if (s[i] == '-' || s[i] == '+') sign = s[i] == '-' ? "-" : "", ++i;
  if (i < s.size() && s[i] == '$') ++i;
  for (; i < s.size() && s[i] != '.'; ++i)
    if (s[i] != ',') whole += s[i];
  if (i < s.size()) frac = std::string(s.substr(i + 1));
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  std::size_t lead = 0;  // "007" = "7"
  while (lead + 1 < whole.size() && whole[lead] == '0') ++lead;
  whole = whole.substr(lead);
  std::string out = whole + (frac.empty() ? "" : "." + frac);
  if (out == "0") return "0";  // "-0" = "0"
  return sign + out;
}

std::optional<std::string> gsm8k_final_answer(std::string_view text) {
  // the last marker with a number after it: "#### 72\n\n#### Explanation" answered 72 (veRL's findall of
  // "#### number" takes its last match; a heading or stray marker after the answer hid it)
  for (auto at = text.rfind("####"); at != std::string_view::npos; at = at == 0 ? std::string_view::npos : text.rfind("####", at - 1)) {
    std::string_view rest = text.substr(at + 4);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    const std::size_t n = number_length(rest);
    if (n == 0) continue;
    // "1.5.2": veRL reads the whole run of digits, '.' and ','; an answer, but not a number, so it matches
    // no reference (format_score) rather than being read as 1.5
    if (n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
      std::size_t e = n;
      while (e < rest.size() && (is_digit(rest[e]) || rest[e] == '.' || rest[e] == ',')) ++e;
      return std::string(rest.substr(0, e));
    }
    // "3." at the end of a sentence: the '.' is punctuation, which normalisation drops anyway
    std::string norm = normalize_number(rest.substr(0, n));
    if (!norm.empty()) return norm;
  }
  return std::nullopt;
}

std::optional<std::string> gsm8k_reference_answer(std::string_view reference) {
  if (auto a = gsm8k_final_answer(reference)) return a;
  if (reference.find("####") != std::string_view::npos) return std::nullopt;  // a marker without a number
  std::string whole = normalize_number(reference);
  if (whole.empty()) return std::nullopt;
  return whole;
}

double gsm8k_exact_match(std::string_view completion, std::string_view reference, double format_score) {
  const auto want = gsm8k_reference_answer(reference);  // none: matches no answer
  const auto got = gsm8k_final_answer(completion);
  if (!got) return 0.0;
  return want && *got == *want ? 1.0 : format_score;
}

double final_answer_format(std::string_view completion) {
  const auto at = completion.rfind("####");
  if (at == std::string_view::npos) return 0.0;
  // the marker starts a line, after any indentation: a byte-level BPE tokenizer's decode keeps the space of
  // " ####" at an answer's start (Qwen2's; SentencePiece drops it), which scored 0 here and 1 under gsm8k
  std::size_t before = at;
  while (before > 0 && (completion[before - 1] == ' ' || completion[before - 1] == '\t')) --before;
  if (before > 0 && completion[before - 1] != '\n') return 0.0;
  std::string_view rest = completion.substr(at + 4);
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  const std::size_t n = number_length(rest);
  if (n == 0) return 0.0;
  return trim(rest.substr(n)).empty() ? 1.0 : 0.0;
}

double overlong_penalty(int64_t length, int64_t max_length, int64_t cache_length) {
  if (max_length <= 0 || cache_length < 0 || cache_length > max_length)
    throw std::invalid_argument("overlong_penalty: need max_length > 0 and 0 <= cache_length <= max_length (got " +
                                std::to_string(max_length) + ", " + std::to_string(cache_length) + ")");
  const int64_t free_up_to = max_length - cache_length;
  if (length <= free_up_to) return 0.0;
  if (length <= max_length) return static_cast<double>(free_up_to - length) / static_cast<double>(cache_length);
  return -1.0;
}

}  // namespace flowrun::rlhf
