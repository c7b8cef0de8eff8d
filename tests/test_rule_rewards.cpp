// Rule-based rewards (models/rlhf/rule_rewards.h): GSM8K exact match with number
// normalisation, the final-answer format rule and DAPO's overlong penalty, by hand
// and on every reference answer of the real GSM8K files.
#include <doctest/doctest.h>

#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "models/rlhf/rule_rewards.h"
#include "runtime/util/assets.h"

using namespace flowrun;
using namespace flowrun::rlhf;

TEST_CASE("numbers normalise: separators, signs, dollars, zero decimals") {
  CHECK(normalize_number("1,080") == "1080");
  CHECK(normalize_number("109,200,000") == "109200000");
  CHECK(normalize_number("42.0") == "42");
  CHECK(normalize_number("42.") == "42");
  CHECK(normalize_number("+42.50") == "42.5");
  CHECK(normalize_number(" $18 ") == "18");
  CHECK(normalize_number("-0.0") == "0");
  CHECK(normalize_number("-7") == "-7");
  CHECK(normalize_number("007") == "7");
  CHECK(normalize_number("0.25") == "0.25");
  // not numbers
  CHECK(normalize_number("") == "");
  CHECK(normalize_number("12a") == "");
  CHECK(normalize_number(",5") == "");
  CHECK(normalize_number("five") == "");
  // integers beyond a double's 53 bits compare exactly (nothing is parsed into a float)
  CHECK(normalize_number("9,007,199,254,740,993") == "9007199254740993");
  CHECK(normalize_number("9007199254740993") != normalize_number("9007199254740992"));
}

TEST_CASE("GSM8K exact match: the last #### answer of the whole completion against the reference's") {
  const std::string ref = "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18";
  CHECK(gsm8k_final_answer(ref) == std::optional<std::string>("18"));
  CHECK(gsm8k_exact_match("9 eggs, 2 dollars each.\n#### 18", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### 18.0", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### $18", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### 17", ref) == 0.0);
  CHECK(gsm8k_exact_match("#### 17", ref, 0.1) == doctest::Approx(0.1));  // veRL's format_score
  CHECK(gsm8k_exact_match("the answer is 18", ref) == 0.0);               // no marker: no answer
  CHECK(gsm8k_exact_match("#### eighteen", ref, 0.1) == 0.0);             // a marker without a number
  // the last marker counts
  CHECK(gsm8k_exact_match("first #### 3, then\n#### 18", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### 18 no wait\n#### 3", ref) == 0.0);
  // the last marker with a number after it (veRL's findall of "#### number"): a markdown heading or a stray
  // marker after the answer scored 0
  CHECK(gsm8k_exact_match("#### 18\n\n#### Explanation\nbecause 9 x 2", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### 18 ####", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### Step 1\n9 x 2\n#### 18\n#### Note", ref) == 1.0);
  CHECK(gsm8k_exact_match("#### Note", ref, 0.1) == 0.0);
  // "1.5.2" is an answer (veRL reads the run of digits, '.' and ',') but no number: wrong, not 1.5
  CHECK(gsm8k_final_answer("#### 1.5.2") == std::optional<std::string>("1.5.2"));
  CHECK(gsm8k_exact_match("#### 1.5.2", "#### 1.5", 0.1) == doctest::Approx(0.1));
  CHECK(gsm8k_exact_match("#### 1.5.", "#### 1.5") == 1.0);  // a full stop after the number
  // no clipping: a marker far from the end (veRL looks at the last 300 characters only)
  CHECK(gsm8k_exact_match("#### 18" + std::string(1000, ' ') + "\n", ref) == 1.0);
  // separators on either side
  CHECK(gsm8k_exact_match("#### 1080", "... #### 1,080") == 1.0);
  CHECK(gsm8k_exact_match("#### 1,080", "#### 1080") == 1.0);
  // a bare reference number
  CHECK(gsm8k_exact_match("#### 72", "72") == 1.0);
  CHECK(gsm8k_exact_match("#### 72", "no number") == 0.0);
  // a reference without a number matches no answer: a well-formed one is wrong (format_score), as in
  // veRL and graphs/examples/gsm8k_reward.py (this rule gave 0: a run's rewards hung on which was used)
  CHECK(gsm8k_reference_answer("The answer is 10") == std::nullopt);
  CHECK(gsm8k_reference_answer("#### ten") == std::nullopt);
  CHECK(gsm8k_reference_answer(" 1,080 ") == std::optional<std::string>("1080"));
  CHECK(gsm8k_exact_match("#### 10", "The answer is 10", 0.25) == doctest::Approx(0.25));
  CHECK(gsm8k_exact_match("#### 10", "#### ten", 0.25) == doctest::Approx(0.25));
  CHECK(gsm8k_exact_match("10", "The answer is 10", 0.25) == 0.0);  // no marker: no answer
}

TEST_CASE("every GSM8K reference answer matches itself and not its neighbour's (real data)") {
  for (const char* file : {"data/gsm8k/train.jsonl", "data/gsm8k/test.jsonl"}) {
    std::ifstream in(asset_path(file));
    REQUIRE_MESSAGE(in, "missing asset " << file);
    std::string line, previous;
    int rows = 0, differ = 0;
    while (std::getline(in, line)) {
      const std::string answer = nlohmann::json::parse(line).at("answer").get<std::string>();
      const auto final = gsm8k_final_answer(answer);
      REQUIRE_MESSAGE(final.has_value(), file << " row " << rows + 1 << " has no final answer");
      CHECK(gsm8k_exact_match(answer, answer) == 1.0);
      CHECK(final_answer_format(answer) == 1.0);
      if (!previous.empty() && gsm8k_final_answer(previous) != final) {
        ++differ;
        CHECK(gsm8k_exact_match(previous, answer) == 0.0);
      }
      previous = answer;
      ++rows;
    }
    CHECK(rows > 1000);
    CHECK(differ > rows / 2);
  }
}

TEST_CASE("the format rule and DAPO's overlong penalty") {
  CHECK(final_answer_format("work...\n#### 42") == 1.0);
  CHECK(final_answer_format("work...\n#### 42\n") == 1.0);
  CHECK(final_answer_format("#### 42") == 1.0);
  CHECK(final_answer_format("work... #### 42") == 0.0);          // not on its own line
  // indented: an answer's first space, which a byte-level BPE decode keeps (" #### 81": 0 before, 1 under gsm8k)
  CHECK(final_answer_format(" #### 81") == 1.0);
  CHECK(final_answer_format("work...\n\t #### 42") == 1.0);
  CHECK(final_answer_format("work... \t#### 42") == 0.0);  // text before the indentation: not its own line
  CHECK(final_answer_format("work...\n#### 42 apples") == 0.0);  // text after the number
  CHECK(final_answer_format("no answer") == 0.0);
  // max 100, cache 20: free up to 80; 90 -> (80 − 90) / 20 = −0.5; 100 -> −1; beyond -> −1
  CHECK(overlong_penalty(80, 100, 20) == 0.0);
  CHECK(overlong_penalty(90, 100, 20) == doctest::Approx(-0.5));
  CHECK(overlong_penalty(100, 100, 20) == doctest::Approx(-1.0));
  CHECK(overlong_penalty(150, 100, 20) == -1.0);
  CHECK(overlong_penalty(100, 100, 0) == 0.0);
  CHECK_THROWS_AS(overlong_penalty(10, 100, 200), std::invalid_argument);
}
