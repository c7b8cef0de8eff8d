#include "models/rlhf/dschat_data.h"

#include "models/chat/value.h"
#include "runtime/util/utf8.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace flowrun::dschat {

namespace {

constexpr const char* assistant_marker = "\n\nAssistant:";

uint64_t splitmix64_next(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// numpy's random_interval (numpy/random/src/distributions/distributions.c), which the
// legacy RandomState.shuffle draws each swap partner with: a uniform integer in
// [0, max] by rejection under the smallest all-ones mask >= max, from 32-bit draws
// while max fits 32 bits, else from 64-bit ones (two draws, the first high).
uint64_t numpy_random_interval(std::mt19937& mt, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
  uint64_t value = 0;
  if (max <= 0xffffffffull) {
    do value = static_cast<uint64_t>(mt()) & mask;
    while (value > max);
  } else {
    do {
      const uint64_t hi = mt();
      value = ((hi << 32) | static_cast<uint64_t>(mt())) & mask;
    } while (value > max);
  }
  return value;
}

// The whole (decompressed) file. gzread passes plain files through unchanged. Throws std::runtime_error naming
// `path` when it is a folder (naming the file to give instead), cannot be opened, or is a damaged gzip file.
std::string read_maybe_gzip(const std::string& path) {
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path + ": is a folder, not a data file; give the path of the JSONL file (or .jsonl.gz) in it "
                             "(a DS-Chat local/jsonfile folder: give its data/train.json itself, a JSON list of rows, "
                             "read as `datasets` reads it; flowrun holds out eval_fraction of it, not eval.json)");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + "); check the path");
  std::string out;
  std::vector<char> buf(1 << 20);
  for (;;) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error(path + ": cannot decompress (" + msg + "); the gzip file is damaged: fetch it again");
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  int err = 0;
  std::string msg = gzerror(f, &err);
  gzclose(f);
  if (err != Z_OK && err != Z_STREAM_END)
    throw std::runtime_error(path + ": cannot decompress (" + msg + "); the gzip file is truncated or damaged");
  return out;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// nlohmann's messages start with "[json.exception.parse_error.101] "; keep the rest.
// `s` with control characters and bytes that are not UTF-8 written as escapes (\n, \xff): nlohmann's "last read"
// excerpt of a bad line quotes its raw bytes, and one 0xff in a log made grep call it a binary file
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence_length(s, i);
    if (n > 1) {
      out.append(s, i, n);
      i += n;
    } else if (n == 1 && c >= 0x20 && c != 0x7F) {
      out += s[i++];
    } else {
      out += c == '\n' ? std::string("\\n") : c == '\r' ? std::string("\\r") : c == '\t' ? std::string("\\t")
                                                                             : fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

std::string short_json_error(const std::string& what) {
  auto p = what.find("] ");
  std::string s = p == std::string::npos ? what : what.substr(p + 2);
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return printable(s);
}

// One row of a data file as read before its layout is known: a JSON Lines line or an item of a file that is one
// JSON list. Either blank, or `j` the JSON object, or `error` why it is not one (bad JSON, another JSON type).
struct raw_row {
  bool blank = false;  // a whitespace-only line (a list's items never are)
  nlohmann::json j;    // the row's object; null when blank or malformed
  std::string error;   // "bad JSON: ..." or "not a JSON object (a TYPE)"; "" when `j` is an object or blank
};

// A parsed JSON value as a row: the object, or "not a JSON object (a TYPE)".
raw_row object_row(nlohmann::json j) {
  raw_row r;
  if (j.is_object()) r.j = std::move(j);
  else r.error = std::string("not a JSON object (") + (j.is_array() ? "an " : "a ") + j.type_name() + ")";
  return r;
}

// The rows of a JSON Lines text: one a line ('\n' ends a line, a '\r' before it is dropped), a whitespace-only line
// blank, a line that is not JSON "bad JSON: ..." (nlohmann's message, shortened and printable).
std::vector<raw_row> json_lines_rows(const std::string& text) {
  std::vector<raw_row> rows;
  size_t a = 0;
  while (a < text.size()) {
    size_t b = text.find('\n', a);
    if (b == std::string::npos) b = text.size();
    std::string line = text.substr(a, b - a);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    a = b + 1;
    raw_row r;
    if (is_blank(line)) {
      r.blank = true;
    } else {
      try {
        r = object_row(nlohmann::json::parse(line));
      } catch (const nlohmann::json::exception& e) {
        r.error = "bad JSON: " + short_json_error(e.what());
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// A text that is one JSON list (`json.dump(rows)`, pretty-printed or on one line, what DS-Chat's local/jsonfile
// train.json holds and `datasets.load_dataset("json")` reads as rows): its first non-whitespace character, after an
// optional UTF-8 byte order mark, is '[' and the whole text parses as a JSON array. Returns false (rows untouched)
// for any other text, which is read as JSON Lines: a file whose first line is a list but that is not one JSON value
// as a whole gets that line's "not a JSON object (an array)". Else fills `rows` with the items, in order, an item that
// is not an object malformed as such a line is, and returns true. Throws std::runtime_error naming `path` and what to
// write when every item is a list: a list of lists holds no rows.
bool json_list_rows(const std::string& path, const std::string& text, std::vector<raw_row>& rows) {
  size_t at = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte order mark
  at = text.find_first_not_of(" \t\r\n", at);
  if (at == std::string::npos || text[at] != '[') return false;
  auto j = nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(at), text.end(), nullptr,
                                 /*allow_exceptions=*/false);
  if (!j.is_array()) {
    // a JSON Lines file whose first line is a list (that line alone is JSON): read as lines, that line malformed
    const size_t eol = text.find('\n', at);
    const auto first = nlohmann::json::parse(text.begin() + static_cast<std::ptrdiff_t>(at),
                                             eol == std::string::npos ? text.end()
                                                                      : text.begin() + static_cast<std::ptrdiff_t>(eol),
                                             nullptr, /*allow_exceptions=*/false);
    if (!first.is_discarded()) return false;
    // else a list that does not parse (a trailing comma, a cut or hand-edited train.json): read as lines it was
    // "bad JSON" at every line and "write one JSON object per line", which sent the user the wrong way
    std::string why;
    try {  // from the file's start (a byte order mark aside), so that nlohmann's line and column are the file's
      (void)nlohmann::json::parse(text.begin() + (text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0), text.end());
    } catch (const nlohmann::json::exception& e) {
      why = short_json_error(e.what());
    }
    throw std::runtime_error(path + ": starts as one JSON list ('[') but is not valid JSON: " + why +
                             "; fix the list (a trailing comma before ']' or a file cut short is the usual cause), or "
                             "write one JSON object a line");
  }
  if (!j.empty() && std::all_of(j.begin(), j.end(), [](const nlohmann::json& x) { return x.is_array(); }))
    throw std::runtime_error(path + ": is one JSON list of " + std::to_string(j.size()) +
                             " items, and its items are not JSON objects (the first is of type array): a list of lists "
                             "holds no rows; write one {\"prompt\": ..., ...} object per row, in one list or one a line");
  rows.clear();
  rows.reserve(j.size());
  for (auto& x : j) rows.push_back(object_row(std::move(x)));
  return true;
}

// Reads a non-empty string field; returns "" on success or the reason it is unusable.
std::string get_string(const nlohmann::json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end()) return std::string("missing key \"") + key + "\"";
  if (it->is_array())  // a conversational field in a row of strings
    return std::string("\"") + key + "\" is a list while \"prompt\" is a string: TRL's conversational rows hold lists "
           "in every field (the prompt's messages, each answer's one assistant message), its standard rows strings";
  if (!it->is_string()) return std::string("\"") + key + "\" is " + it->type_name() + ", not a string";
  out = it->get<std::string>();
  if (out.empty()) return std::string("empty \"") + key + "\"";
  return "";
}

std::vector<const char*> keys_of(data_format f) {
  switch (f) {
    case data_format::prompt_chosen_rejected: return {"prompt", "chosen", "rejected"};
    case data_format::prompt_chosen: return {"prompt", "chosen"};
    case data_format::hh_rlhf_raw: return {"chosen", "rejected"};
    case data_format::question_answer: return {"question", "answer"};
    case data_format::prompt_completion: return {"prompt", "completion"};
    case data_format::prompt_only: return {"prompt"};
    default: return {};
  }
}

// The layout a JSON object suggests, or automatic when it suggests none.
data_format detect(const nlohmann::json& j) {
  auto has = [&](const char* k) { return j.contains(k); };
  if (has("prompt") && has("chosen") && has("rejected")) return data_format::prompt_chosen_rejected;
  if (has("prompt") && has("chosen")) return data_format::prompt_chosen;
  if (has("chosen") && has("rejected")) return data_format::hh_rlhf_raw;
  if (has("question") && has("answer")) return data_format::question_answer;
  if (has("prompt") && has("completion")) return data_format::prompt_completion;
  if (has("messages")) return data_format::messages;
  if (has("prompt")) return data_format::prompt_only;
  return data_format::automatic;
}

// "UNIT N: reason; ..." for the first `max_listed` of `bad`, UNIT "line" (JSON Lines) or "item" (a JSON list).
std::string list_bad(const std::vector<bad_line>& bad, size_t max_listed, const char* unit) {
  std::ostringstream os;
  for (size_t i = 0; i < bad.size() && i < max_listed; ++i)
    os << (i ? "; " : "") << unit << " " << bad[i].line << ": " << bad[i].reason;
  if (bad.size() > max_listed) os << "; ... (" << bad.size() - max_listed << " more)";
  return os.str();
}

// Messages [0, n) of `m` (each {"role": system | user | assistant, "content": string}, a system message only
// first) into `s.messages` and s.prompt's DS-Chat text ("\n\nHuman: ..."), the last of them the user's; "" or
// why they are unusable, naming the message by its index in `what`.
std::string read_prompt_turns(const nlohmann::json& m, size_t n, const std::string& what, sample& s) {
  nlohmann::ordered_json kept = nlohmann::ordered_json::array();
  std::string text;
  for (size_t k = 0; k < n; ++k) {
    const auto& x = m[k];
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string() || !x.contains("content") ||
        !x["content"].is_string())
      return what + " message " + std::to_string(k) + " is not {\"role\": string, \"content\": string}";
    const std::string role = x["role"].get<std::string>(), content = x["content"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant")
      return what + " message " + std::to_string(k) + " has role \"" + role + "\" (system, user or assistant)";
    if (role == "system" && k != 0)
      return what + ": a system message after the first (message " + std::to_string(k) + ")";
    kept.push_back({{"role", role}, {"content", content}});
    text += role == "system" ? content : (role == "user" ? "\n\nHuman: " : "\n\nAssistant: ") + content;
  }
  if (kept.empty() || kept.back()["role"] != "user") return what + ": no user message before the assistant's answer";
  s.prompt = text + "\n\nAssistant:";
  s.messages = std::move(kept);
  return "";
}

// The assistant's answer a message `x` holds, as DS-Chat's answers begin: with a space; "" or why not.
std::string read_answer(const nlohmann::json& x, const std::string& what, std::string& out) {
  if (!x.is_object() || x.value("role", "") != "assistant" || !x.contains("content") || !x["content"].is_string())
    return what + " is not the assistant's {\"role\": \"assistant\", \"content\": string}";
  if (x["content"].get<std::string>().empty()) return what + " is empty";
  out = " " + x["content"].get<std::string>();
  return "";
}

// A TRL conversational row {"messages": [{"role", "content"}, ...]} into `s`: the messages before the last,
// which must be the assistant's (the answer SFT learns), and their DS-Chat text; "" or why it is unusable.
std::string read_messages(const nlohmann::json& j, sample& s) {
  const auto& m = j.at("messages");
  if (!m.is_array() || m.empty()) return "\"messages\" is not a non-empty list of {role, content}";
  const auto& last = m.back();
  if (last.is_object() && last.contains("role") && last["role"].is_string() && last["role"] != "assistant") {
    const std::string role = last["role"].get<std::string>();
    if (role != "user" && role != "system")
      return "\"messages\" message " + std::to_string(m.size() - 1) + " has role \"" + role +
             "\" (system, user or assistant)";
    return "the last message is the " + role + "'s: a conversation to learn from ends with the assistant's answer";
  }
  if (auto why = read_answer(last, "the last message", s.chosen); !why.empty()) return why;
  return read_prompt_turns(m, m.size() - 1, "\"messages\"", s);
}

// TRL's conversational prompt-completion and preference rows: "prompt" a list of messages ending with the
// user's, each answer ("completion", or "chosen" and "rejected") a list holding the assistant's one message.
std::string read_conversational(const nlohmann::json& j, const std::vector<const char*>& answers, sample& s) {
  for (const char* key : answers) {
    if (!j.contains(key)) return std::string("missing key \"") + key + "\"";
    const auto& a = j.at(key);
    if (!a.is_array() || a.size() != 1)
      return std::string("\"") + key + "\" is not a list of the assistant's one message (TRL's conversational layout)";
    std::string text;
    if (auto why = read_answer(a[0], std::string("\"") + key + "\"'s message", text); !why.empty()) return why;
    (std::string(key) == "rejected" ? s.rejected : s.chosen) = text;
  }
  const auto& p = j.at("prompt");
  if (p.empty()) return "\"prompt\" is an empty list";
  return read_prompt_turns(p, p.size(), "\"prompt\"", s);
}

// What one row of a file is read as, the same for a JSON Lines line and a JSON list's item.
enum class row_outcome { loaded, malformed, prompts_differ };

// Reads the JSON object `j` (a raw_row's) as a row of layout `format` (decided: not automatic) into `s`: the keys
// of `format` (keys_of) as non-empty strings, TRL's conversational rows as lists of messages, a raw HH-RLHF pair
// split at its last "\n\nAssistant:" into prompt and answers. Returns loaded; malformed with `why` set (a missing,
// empty or non-string key, a KTO row, a dialogue without an answer...); or prompts_differ, a raw HH-RLHF pair whose
// two dialogues differ before their answers.
row_outcome read_row(const nlohmann::json& j, data_format format, sample& s, std::string& why) {
  if (format == data_format::messages) {  // TRL's conversational rows: their own reading
    why = read_messages(j, s);
    return why.empty() ? row_outcome::loaded : row_outcome::malformed;
  }
  const auto keys = keys_of(format);
  if (format == data_format::prompt_completion && j.contains("label")) {  // KTO's desirable / undesirable
    why = "a {prompt, completion, label} row is TRL's KTO layout (an unpaired preference): no trainer here reads it, "
          "and SFT would learn the undesirable completions too; keep the rows whose label is true, without the key";
    return row_outcome::malformed;
  }
  // TRL's conversational prompt-completion and preference rows: lists of messages
  if ((format == data_format::prompt_completion || format == data_format::prompt_chosen_rejected ||
       format == data_format::prompt_chosen) &&
      j.contains("prompt") && j["prompt"].is_array()) {
    std::vector<const char*> answers(keys.begin() + 1, keys.end());
    why = read_conversational(j, answers, s);
    return why.empty() ? row_outcome::loaded : row_outcome::malformed;
  }
  std::vector<std::string> vals(keys.size());
  for (size_t k = 0; k < keys.size() && why.empty(); ++k) why = get_string(j, keys[k], vals[k]);
  if (!why.empty()) return row_outcome::malformed;
  if (format == data_format::hh_rlhf_raw) {
    std::string pc, ac, pr, ar;
    if (!split_dialogue(vals[0], pc, ac)) why = "no \"\\n\\nAssistant:\" turn in \"chosen\"";
    else if (!split_dialogue(vals[1], pr, ar)) why = "no \"\\n\\nAssistant:\" turn in \"rejected\"";
    else if (ac.empty()) why = "empty answer after the last \"\\n\\nAssistant:\" of \"chosen\"";
    else if (ar.empty()) why = "empty answer after the last \"\\n\\nAssistant:\" of \"rejected\"";
    if (!why.empty()) return row_outcome::malformed;
    if (pc != pr) return row_outcome::prompts_differ;
    s.prompt = std::move(pc);
    s.chosen = std::move(ac);
    s.rejected = std::move(ar);
    return row_outcome::loaded;
  }
  s.prompt = std::move(vals[0]);
  if (format != data_format::prompt_only) s.chosen = std::move(vals[1]);
  if (format == data_format::prompt_chosen_rejected) s.rejected = std::move(vals[2]);
  s.question = format == data_format::question_answer || format == data_format::prompt_completion;
  return row_outcome::loaded;
}

int32_t i32(int64_t v) { return static_cast<int32_t>(v); }

void check_indices(const char* what, size_t n, const std::vector<int64_t>& indices) {
  if (indices.empty()) throw std::invalid_argument(std::string(what) + ": no indices (an empty batch)");
  for (int64_t i : indices)
    if (i < 0 || static_cast<size_t>(i) >= n)
      throw std::invalid_argument(std::string(what) + ": index " + std::to_string(i) + " outside the " +
                                  std::to_string(n) + " examples");
}

int64_t batch_width(const char* what, int64_t longest, int64_t pad_to) {
  if (pad_to <= 0) return longest;
  if (longest > pad_to)
    throw std::invalid_argument(std::string(what) + ": a row has " + std::to_string(longest) +
                                " tokens, more than pad_to = " + std::to_string(pad_to) +
                                "; tokenize with max_seq_len <= pad_to or raise pad_to");
  return pad_to;
}

}  // namespace

const char* format_name(data_format f) {
  switch (f) {
    case data_format::automatic: return "automatic";
    case data_format::prompt_chosen_rejected: return "prompt/chosen/rejected";
    case data_format::prompt_chosen: return "prompt/chosen";
    case data_format::hh_rlhf_raw: return "raw HH-RLHF chosen/rejected dialogues";
    case data_format::question_answer: return "question/answer (GSM8K)";
    case data_format::prompt_completion: return "prompt/completion (TRL)";
    case data_format::messages: return "messages (TRL conversational)";
    case data_format::prompt_only: return "prompt only (RL prompts)";
  }
  return "?";
}

std::pair<data_format, int64_t> load_report::commonest(const std::function<bool(data_format)>& wanted) const {
  std::pair<data_format, int64_t> best{data_format::automatic, 0};
  for (const auto& [f, n] : layouts)
    if (wanted(f) && n > best.second) best = {f, n};
  return best;
}

std::string load_report::summary(size_t max_listed) const {
  const std::string u = unit();  // "line", or "item" in a JSON list
  std::ostringstream os;
  os << path << ": " << loaded << " rows loaded (" << format_name(format) << ") of " << lines << " " << u << "s";
  if (blank) os << " (" << blank << " blank)";
  os << "; " << malformed.size() << " malformed";
  if (!malformed.empty()) {
    os << " (" << list_bad(malformed, max_listed, unit()) << "), skipped: fix or remove those " << u << "s to use them";
    // lines of another layout are malformed in this one: say which line decided it (a raw HH-RLHF first line made
    // 30 {prompt, chosen, rejected} pairs malformed with "no Assistant turn" and trained on 1 row)
    const auto [other, most] = commonest([&](data_format f) { return f != format; });
    if (most > 0 && layout_line > 0)
      os << " (" << most << " of the " << u << "s hold " << format_name(other) << " rows: " << u << " " << layout_line
         << ", the first, decided the layout " << format_name(format) << ")";
  }
  if (format == data_format::hh_rlhf_raw) {
    os << "; " << prompt_mismatch_lines.size() << " dropped: prompts differ";
    if (!prompt_mismatch_lines.empty()) {
      os << " (" << u << "s";
      for (size_t i = 0; i < prompt_mismatch_lines.size() && i < max_listed; ++i)
        os << (i ? ", " : " ") << prompt_mismatch_lines[i];
      if (prompt_mismatch_lines.size() > max_listed) os << ", ...";
      os << ")";
    }
  }
  return os.str();
}

bool split_dialogue(const std::string& dialogue, std::string& prompt, std::string& answer) {
  auto p = dialogue.rfind(assistant_marker);
  if (p == std::string::npos) return false;
  const size_t end = p + std::strlen(assistant_marker);
  prompt = dialogue.substr(0, end);
  answer = dialogue.substr(end);
  return true;
}

source load_source(const std::string& path, data_format format) {
  source src;
  src.path = path;
  load_report& rep = src.report;
  rep.path = path;
  const std::string text = read_maybe_gzip(path);
  // a file that is one JSON list has its items as rows, else its lines: both read row by row below, alike
  std::vector<raw_row> rows;
  rep.json_list = json_list_rows(path, text, rows);
  if (!rep.json_list) rows = json_lines_rows(text);
  const std::string u = rep.unit();  // "line", or "item" in a JSON list
  rep.lines = static_cast<int64_t>(rows.size());

  if (format == data_format::automatic) {
    // the first object's layout (a file of pairs with some {prompt, chosen} lines still trains SFT on every row,
    // and the reward model on the pairs, the others named as malformed); rep.layouts counts each layout's lines,
    // so that a first line missing a key is named when the layout it decided is refused (a review, 2026-12-07)
    for (size_t i = 0; i < rows.size() && format == data_format::automatic; ++i) {
      if (rows[i].j.is_object()) format = detect(rows[i].j);
      if (format != data_format::automatic) rep.layout_line = static_cast<int64_t>(i + 1);
    }
    if (format == data_format::automatic) {
      // TRL's other layouts are named with what to give instead
      auto unknown = [](const nlohmann::json& j) -> std::string {
        if (j.contains("text"))
          return "a {text} row (TRL's language-modeling format) is not read here: fine-tuning reads {prompt, "
                 "completion} rows, and plain-text pretraining is lm_batches' text file (graphs/pretrain.graph)";
        return "a JSON object without prompt/chosen/rejected, prompt/completion, messages or question/answer keys";
      };
      std::vector<bad_line> bad;
      for (size_t i = 0; i < rows.size() && bad.size() < 5; ++i)
        if (!rows[i].blank)
          bad.push_back({static_cast<int64_t>(i + 1), rows[i].error.empty() ? unknown(rows[i].j) : rows[i].error});
      const std::string empty = rep.json_list ? " (the list is empty)" : " (the file is empty)";
      throw std::runtime_error(path + ": cannot tell the data layout: no " + u + " is a JSON object with the keys "
                                      "{prompt, chosen, rejected}, {prompt, chosen}, {chosen, rejected}, {question, answer}, "
                                      "{prompt, completion}, {messages} or {prompt} (RL prompts only)" +
                               (bad.empty() ? empty : " (" + list_bad(bad, 5, u.c_str()) + ")") +
                               "; fix the file: one JSON object per " + u + ", such as {\"prompt\": \"...\", \"chosen\": "
                               "\"...\", \"rejected\": \"...\"} (DS-Chat's layout)");
    }
  }
  rep.format = format;
  for (const auto& r : rows)
    if (r.j.is_object())
      if (const auto f = detect(r.j); f != data_format::automatic) ++rep.layouts[f];

  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t ln = static_cast<int64_t>(i + 1);
    if (rows[i].blank) {
      ++rep.blank;
      continue;
    }
    if (!rows[i].error.empty()) {
      rep.malformed.push_back({ln, rows[i].error});
      continue;
    }
    sample s;
    std::string why;
    switch (read_row(rows[i].j, format, s, why)) {
      case row_outcome::loaded: src.rows.push_back(std::move(s)); break;
      case row_outcome::malformed: rep.malformed.push_back({ln, why}); break;
      case row_outcome::prompts_differ: rep.prompt_mismatch_lines.push_back(ln); break;
    }
  }
  rep.loaded = static_cast<int64_t>(src.rows.size());
  if (src.rows.empty()) {
    const auto keys = keys_of(format);
    std::ostringstream os;
    os << path << ": no usable " << u << " (" << rep.lines << " " << u << "s, ";
    if (!rep.json_list) os << rep.blank << " blank, ";  // a list's items are never blank
    os << rep.malformed.size() << " malformed";
    if (format == data_format::hh_rlhf_raw) os << ", " << rep.prompt_mismatch_lines.size() << " with differing prompts";
    os << ")";
    if (!rep.malformed.empty()) os << ": " << list_bad(rep.malformed, 5, u.c_str());
    os << ". Expected one JSON object per " << u << " with non-empty string fields";
    for (size_t k = 0; k < keys.size(); ++k) os << (k ? ", " : " ") << '"' << keys[k] << '"';
    os << " (" << format_name(format) << ")";
    throw std::runtime_error(os.str());
  }
  return src;
}

std::vector<source> load_sources(const std::vector<std::string>& paths, data_format format) {
  if (paths.empty()) throw std::invalid_argument("load_sources: no data paths given (DS-Chat's --data_path)");
  std::vector<source> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(load_source(p, format));
  return out;
}

// ---- data_split ------------------------------------------------------------

std::vector<double> parse_data_split(const std::string& data_split) {
  std::vector<double> w;
  std::string part;
  std::istringstream in(data_split);
  double sum = 0;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || part.find_first_not_of(" \t", used) != std::string::npos || !std::isfinite(v) || v < 0)
      throw std::invalid_argument("data_split \"" + data_split + "\": part \"" + part +
                                  "\" is not a non-negative number; use comma-separated weights such as \"2,4,4\"");
    w.push_back(v);
    sum += v;
  }
  if (!data_split.empty() && data_split.back() == ',')
    throw std::invalid_argument("data_split \"" + data_split + "\": empty last part; use weights such as \"2,4,4\"");
  if (w.empty() || sum <= 0)
    throw std::invalid_argument("data_split \"" + data_split + "\": needs at least one positive weight, e.g. \"2,4,4\"");
  return w;
}

std::vector<int64_t> split_boundaries(int64_t n, const std::vector<double>& weights) {
  if (n < 0) throw std::invalid_argument("split_boundaries: negative size");
  double sum = 0;
  for (double w : weights) sum += w;
  if (weights.empty() || sum <= 0) throw std::invalid_argument("split_boundaries: weights must have a positive sum");
  std::vector<int64_t> b{0};
  for (double w : weights) {
    double frac = w / sum;
    // Python's int(round(x)): round half to even (nearbyint in the default rounding mode)
    b.push_back(b.back() + static_cast<int64_t>(std::nearbyint(frac * static_cast<double>(n))));
  }
  const int64_t diff = b.back() - n;
  for (size_t i = 1; i < b.size(); ++i) b[i] -= diff;
  return b;
}

std::vector<int64_t> shuffle_indices(int64_t n, uint64_t seed) {
  if (seed > 0xffffffffull)
    throw std::invalid_argument("seed " + std::to_string(seed) +
                                " is 2^32 or more: DS-Chat's data split shuffles with numpy's RandomState, whose seed is "
                                "a 32-bit number; give a seed below 4294967296");
  std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  // RandomState(seed) seeds MT19937 by init_genrand(seed), as std::mt19937(seed) does
  std::mt19937 mt(static_cast<std::mt19937::result_type>(seed));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(numpy_random_interval(mt, static_cast<uint64_t>(i)));
    std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
  }
  return idx;
}

std::vector<int64_t> split_part(int64_t n, const std::vector<double>& weights, int part, uint64_t seed) {
  if (part < 0 || static_cast<size_t>(part) >= weights.size())
    throw std::invalid_argument("split_part: part " + std::to_string(part) + " outside the " +
                                std::to_string(weights.size()) + " parts of the split");
  auto b = split_boundaries(n, weights);
  auto perm = shuffle_indices(n, seed);
  // A boundary can fall below 0 after the correction for tiny n; clamp the range.
  int64_t lo = std::clamp<int64_t>(b[static_cast<size_t>(part)], 0, n);
  int64_t hi = std::clamp<int64_t>(b[static_cast<size_t>(part) + 1], lo, n);
  return std::vector<int64_t>(perm.begin() + lo, perm.begin() + hi);
}

std::vector<int64_t> split_for_step(int64_t n, const std::string& data_split, int step_index, uint64_t seed) {
  auto w = parse_data_split(data_split);
  if (step_index < 0 || static_cast<size_t>(step_index) >= w.size())
    throw std::invalid_argument("split_for_step: step index " + std::to_string(step_index) + " but data_split \"" +
                                data_split + "\" has " + std::to_string(w.size()) +
                                " parts; give one weight per training step, e.g. \"2,4,4\"");
  return split_part(n, w, step_index, seed);
}

step_rows rows_for_step(const std::vector<source>& sources, int step_index, const split_settings& cfg) {
  if (sources.empty()) throw std::invalid_argument("rows_for_step: no data sources");
  if (!(cfg.eval_fraction >= 0 && cfg.eval_fraction < 1))
    throw std::invalid_argument("rows_for_step: eval_fraction " + std::to_string(cfg.eval_fraction) +
                                " must be in [0, 1)");
  auto w = parse_data_split(cfg.data_split);
  if (step_index < 0 || static_cast<size_t>(step_index) >= w.size())
    throw std::invalid_argument("rows_for_step: step index " + std::to_string(step_index) + " but data_split \"" +
                                cfg.data_split + "\" has " + std::to_string(w.size()) + " parts");
  step_rows out;
  std::ostringstream per;
  for (size_t si = 0; si < sources.size(); ++si) {
    const int64_t n = static_cast<int64_t>(sources[si].rows.size());
    std::vector<int64_t> train_all, eval_all;
    if (cfg.eval_fraction > 0) {
      const std::vector<double> te = {1.0 - cfg.eval_fraction, cfg.eval_fraction};
      train_all = split_part(n, te, 0, cfg.seed);
      eval_all = split_part(n, te, 1, cfg.seed);
    } else {
      train_all.resize(static_cast<size_t>(n));
      std::iota(train_all.begin(), train_all.end(), int64_t{0});
    }
    auto pick = [&](const std::vector<int64_t>& base, std::vector<sample>& rows, std::vector<row_ref>& refs) {
      auto sub = split_part(static_cast<int64_t>(base.size()), w, step_index, cfg.seed);
      for (int64_t k : sub) {
        int64_t r = base[static_cast<size_t>(k)];
        rows.push_back(sources[si].rows[static_cast<size_t>(r)]);
        refs.push_back({static_cast<int32_t>(si), r});
      }
      return static_cast<int64_t>(sub.size());
    };
    int64_t nt = pick(train_all, out.train, out.train_refs);
    int64_t ne = eval_all.empty() ? 0 : pick(eval_all, out.eval, out.eval_refs);
    per << (si ? "; " : "") << sources[si].path << ": " << nt << " + " << ne;
  }
  if (sources.size() > 1) {  // blending: shuffle the concatenation
    auto blend = [&](std::vector<sample>& rows, std::vector<row_ref>& refs) {
      auto perm = shuffle_indices(static_cast<int64_t>(rows.size()), cfg.seed);
      std::vector<sample> r2;
      std::vector<row_ref> f2;
      r2.reserve(rows.size());
      f2.reserve(refs.size());
      for (int64_t p : perm) {
        r2.push_back(std::move(rows[static_cast<size_t>(p)]));
        f2.push_back(refs[static_cast<size_t>(p)]);
      }
      rows = std::move(r2);
      refs = std::move(f2);
    };
    blend(out.train, out.train_refs);
    blend(out.eval, out.eval_refs);
  }
  std::ostringstream os;
  os << "step " << step_index + 1 << " (data_split " << cfg.data_split << ", seed " << cfg.seed << ", eval_fraction "
     << cfg.eval_fraction << "): train " << out.train.size() << ", eval " << out.eval.size() << " (" << per.str()
     << ")";
  out.summary = os.str();
  return out;
}

std::vector<std::vector<int64_t>> epoch_batches(int64_t n, int64_t batch_size, uint64_t seed, int64_t epoch,
                                                bool shuffle) {
  if (batch_size < 1) throw std::invalid_argument("epoch_batches: batch_size must be >= 1");
  std::vector<int64_t> order;
  if (shuffle) {
    uint64_t s = seed ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(epoch + 1));
    order = shuffle_indices(n, splitmix64_next(s) & 0xffffffffull);
  } else {
    order.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t a = 0; a < n; a += batch_size)
    out.emplace_back(order.begin() + a, order.begin() + std::min(n, a + batch_size));
  return out;
}

// ---- tokenization ----------------------------------------------------------

std::string process_report::summary() const {
  std::ostringstream os;
  os << kept << " of " << input << " examples";
  if (filtered) os << ", " << filtered << " filtered (prompt longer than max_prompt_seq_len)";
  os << ", " << truncated << " truncated";
  if (prompt_lost)
    os << " (" << prompt_lost << " of them kept no prompt token: their answers alone reach max_seq_len; raise it "
       << "to keep the prompts)";
  if (identical)
    os << ", " << identical << " pairs identical after tokenization"
       << (identical_skipped ? " (skipped: chosen = rejected)" : "");
  os << "; length mean " << mean_len << ", max " << max_len;
  return os.str();
}

nlohmann::ordered_json row_messages(const sample& row) {
  if (!row.messages.empty()) return row.messages;  // a conversational row's own
  return row.question ? gsm8k_messages(row.prompt) : dschat_messages(row.prompt);
}

std::string prompt_text(const sample& row, const tokenize_settings& cfg) {
  return cfg.chat ? cfg.chat->prompt(row_messages(row)) : row.prompt;
}

chat_prompt_response prompt_answer_text(const sample& row, const std::string& answer, const tokenize_settings& cfg) {
  if (!cfg.chat) return {row.prompt, row.prompt + answer};
  // a DS-Chat answer (" Hello.") is stripped, as its prompt's turns are; a conversational row's assistant message is
  // rendered as written (less the space read_answer put before it for the runs without a template), as TRL's
  // SFTTrainer and apply_chat_template render it (a Qwen2 answer " final answer\n" lost its spaces here: a break-it
  // review, 2026-12-07)
  if (row.messages.empty()) return cfg.chat->prompt_response(row_messages(row), chat::py_strip(answer, nullptr, true, true));
  return cfg.chat->prompt_response(row_messages(row), !answer.empty() && answer[0] == ' ' ? answer.substr(1) : answer);
}

std::string rendered_row_line(const std::string& tag, const sample& row, const row_ref& ref, const std::string& path,
                              const tokenize_settings& cfg, bool prompt_only) {
  if (!cfg.chat) return "";
  const std::string text = prompt_only ? prompt_text(row, cfg) : prompt_answer_text(row, row.chosen, cfg).full;
  return tag + " chat template " + cfg.chat->chat_template_of_model().tmpl.name() + ": data row " +
         std::to_string(ref.row) + " of " + path + " renders as " + nlohmann::json(text).dump();
}

bool truncate_keep_eos(std::vector<int32_t>& ids, int64_t max_len, bool keep_eos, int32_t eos) {
  if (max_len < 1) throw std::invalid_argument("truncate_keep_eos: max_len must be >= 1");
  if (static_cast<int64_t>(ids.size()) <= max_len) return false;
  ids.resize(static_cast<size_t>(max_len));
  if (keep_eos) ids.back() = eos;
  return true;
}

namespace {

std::vector<int32_t> with_bos(const tokenizer& tok, const std::string& text, bool add_bos) {
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(tok.bos_id());
  auto t = tok.encode(text, false, false);
  ids.insert(ids.end(), t.begin(), t.end());
  return ids;
}

// BOS (without a chat template, when add_bos; a template writes its own) + the text's tokens.
std::vector<int32_t> text_ids(const tokenizer& tok, const std::string& text, const tokenize_settings& cfg) {
  return with_bos(tok, text, cfg.add_bos && !cfg.chat);
}

// How many leading ids truncation keeps: the BOS (added, or written by the chat template).
int64_t head_of(const std::vector<int32_t>& ids, const tokenizer& tok, const tokenize_settings& cfg) {
  if (!cfg.chat) return cfg.add_bos ? 1 : 0;
  return !ids.empty() && ids[0] == tok.bos_id() ? 1 : 0;
}

// "row I: " + the cause, for a row the chat template (or the HH-RLHF turn split) refused.
template <typename F>
auto for_row(size_t i, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument("row " + std::to_string(i) + ": " + e.what());
  }
}

// BOS + prompt + answer + EOS (uncut), and how many leading ids are prompt tokens (BOS
// included): the longest common prefix with BOS + the prompt's own tokens, so a token
// merged across the boundary counts as answer. With a chat template: the template's renderings
// (prompt_answer_text), EOS only when the answer's tokens hold none.
struct split_seq {
  std::vector<int32_t> ids;
  int64_t prompt_len = 0;
};
split_seq full_sequence(const tokenizer& tok, const sample& row, const std::string& answer,
                        const tokenize_settings& cfg) {
  const auto texts = prompt_answer_text(row, answer, cfg);
  split_seq s;
  s.ids = text_ids(tok, texts.full, cfg);
  auto p = text_ids(tok, texts.prompt, cfg);
  size_t k = 0;
  while (k < p.size() && k < s.ids.size() && p[k] == s.ids[k]) ++k;
  s.prompt_len = static_cast<int64_t>(k);
  const bool has_eos = cfg.chat && std::find(s.ids.begin() + static_cast<std::ptrdiff_t>(k), s.ids.end(),
                                             tok.eos_id()) != s.ids.end();
  if (cfg.add_eos && !has_eos) s.ids.push_back(tok.eos_id());
  return s;
}

// Remove ids [head, head + d) (the oldest prompt tokens after BOS).
void drop_prompt_start(split_seq& s, int64_t head, int64_t d) {
  if (d <= 0) return;
  s.ids.erase(s.ids.begin() + head, s.ids.begin() + head + d);
  s.prompt_len -= d;
}

// Cut the end to max_seq_len (EOS kept); the prompt length is capped so that EOS stays a target.
bool cut_end(split_seq& s, const tokenize_settings& cfg, int32_t eos) {
  bool cut = truncate_keep_eos(s.ids, cfg.max_seq_len, cfg.add_eos, eos);
  const int64_t n = static_cast<int64_t>(s.ids.size());
  s.prompt_len = std::min<int64_t>(s.prompt_len, cfg.add_eos ? n - 1 : n);
  return cut;
}

// The settings as `tok` can follow them: a tokenizer without BOS or EOS (an HF tokenizer.json whose
// tokenizer_config.json names none) adds none, as tokenizer::encode does, rather than the id -1; BOS
// only where the model's tokenizer puts it (tok.adds_bos(): DS-Chat tokenizes with the model's
// tokenizer, and GPT-2's puts none).
tokenize_settings for_tokenizer(tokenize_settings cfg, const tokenizer& tok) {
  cfg.add_bos = cfg.add_bos && tok.bos_id() >= 0 && tok.adds_bos();
  cfg.add_eos = cfg.add_eos && tok.eos_id() >= 0;
  return cfg;
}

void check_len(const tokenize_settings& cfg) {
  if (cfg.max_seq_len < 2)
    throw std::invalid_argument("dschat tokenization: max_seq_len " + std::to_string(cfg.max_seq_len) +
                                " must be >= 2 (BOS and EOS)");
}

}  // namespace

std::vector<sft_example> make_sft_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                           const tokenize_settings& cfg_in, process_report* report) {
  const tokenize_settings cfg = for_tokenizer(cfg_in, tok);
  check_len(cfg);
  std::vector<sft_example> out;
  out.reserve(rows.size());
  process_report rep;
  rep.input = static_cast<int64_t>(rows.size());
  double sum = 0;
  for (const auto& r : rows) {
    if (r.chosen.empty())  // prompt-only data (a prompt with an empty answer is dropped by the loader)
      throw std::invalid_argument("row " + std::to_string(&r - rows.data()) +
                                  " has no answer: this is {prompt} data (RL prompts, for step 3); SFT learns from "
                                  "{prompt, chosen} rows");
    auto q = for_row(static_cast<size_t>(&r - rows.data()), [&] { return full_sequence(tok, r, r.chosen, cfg); });
    const int64_t head = head_of(q.ids, tok, cfg);
    const int64_t excess = static_cast<int64_t>(q.ids.size()) - cfg.max_seq_len;
    bool cut = false;
    if (excess > 0 && cfg.truncation == truncation_mode::prompt_start) {
      const int64_t d = std::min(excess, q.prompt_len - head);
      rep.prompt_lost += d > 0 && d == q.prompt_len - head;
      drop_prompt_start(q, head, d);
      cut = d > 0;
    }
    cut = cut_end(q, cfg, tok.eos_id()) || cut;
    sft_example e;
    e.ids = std::move(q.ids);
    e.prompt_len = q.prompt_len;
    e.truncated = cut;
    const int64_t n = static_cast<int64_t>(e.ids.size());
    rep.truncated += e.truncated;
    rep.max_len = std::max(rep.max_len, n);
    sum += static_cast<double>(n);
    out.push_back(std::move(e));
  }
  rep.kept = static_cast<int64_t>(out.size());
  rep.mean_len = out.empty() ? 0 : sum / static_cast<double>(out.size());
  if (report) *report = rep;
  return out;
}

std::vector<rm_example> make_rm_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                         const tokenize_settings& cfg_in, process_report* report) {
  const tokenize_settings cfg = for_tokenizer(cfg_in, tok);
  check_len(cfg);
  std::vector<rm_example> out;
  out.reserve(rows.size());
  process_report rep;
  rep.input = static_cast<int64_t>(rows.size());
  double sum = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.rejected.empty())
      throw std::invalid_argument("row " + std::to_string(i) + " has no rejected answer: this is " +
                                  (r.chosen.empty() ? "{prompt} data (RL prompts, for step 3)"
                                                    : "{prompt, chosen} data (for SFT; GSM8K's {question, answer} reads so)") +
                                  "; a reward model or DPO learns from pairs, {prompt, chosen, rejected} or raw HH-RLHF {chosen, rejected}");
    auto c = for_row(i, [&] { return full_sequence(tok, r, r.chosen, cfg); });
    auto j = for_row(i, [&] { return full_sequence(tok, r, r.rejected, cfg); });
    const int64_t head = head_of(c.ids, tok, cfg);
    const int64_t excess =
        static_cast<int64_t>(std::max(c.ids.size(), j.ids.size())) - cfg.max_seq_len;
    bool cut = false, lost = false;
    if (excess > 0 && cfg.truncation == truncation_mode::prompt_start) {
      // both start with the same min(prompt_len) tokens: drop the same count from both
      const int64_t d = std::min(excess, std::min(c.prompt_len, j.prompt_len) - head);
      lost = d > 0 && d == std::min(c.prompt_len, j.prompt_len) - head;
      drop_prompt_start(c, head, d);
      drop_prompt_start(j, head, d);
      cut = d > 0;
    }
    cut = cut_end(c, cfg, tok.eos_id()) || cut;
    cut = cut_end(j, cfg, tok.eos_id()) || cut;
    rm_example e;
    e.chosen = std::move(c.ids);
    e.rejected = std::move(j.ids);
    e.chosen_prompt_len = c.prompt_len;
    e.rejected_prompt_len = j.prompt_len;
    e.truncated = cut;
    if (e.chosen == e.rejected) {
      ++rep.identical;
      if (cfg.skip_identical) continue;
    }
    rep.truncated += e.truncated;
    rep.prompt_lost += lost;
    rep.max_len = std::max<int64_t>({rep.max_len, static_cast<int64_t>(e.chosen.size()),
                                     static_cast<int64_t>(e.rejected.size())});
    sum += static_cast<double>(e.chosen.size() + e.rejected.size()) / 2.0;
    out.push_back(std::move(e));
  }
  rep.kept = static_cast<int64_t>(out.size());
  rep.identical_skipped = cfg.skip_identical;
  rep.mean_len = out.empty() ? 0 : sum / static_cast<double>(out.size());
  if (report) *report = rep;
  return out;
}

std::vector<prompt_example> make_prompt_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                                 const tokenize_settings& cfg_in, process_report* report) {
  const tokenize_settings cfg = for_tokenizer(cfg_in, tok);
  const int64_t P = cfg.max_prompt_seq_len;
  if (P < 1 || (cfg.add_bos && P < 2))
    throw std::invalid_argument("max_prompt_seq_len = " + std::to_string(P) +
                                (P < 1 ? std::string(" holds no token")
                                       : " holds only the BOS the tokenizer puts first, no prompt token") +
                                ": give at least " + (cfg.add_bos ? "2" : "1") + " (DS-Chat's default 256)");
  std::vector<prompt_example> out;
  process_report rep;
  rep.input = static_cast<int64_t>(rows.size());
  double sum = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    prompt_example e;
    e.ids = text_ids(tok, for_row(i, [&] { return prompt_text(r, cfg); }), cfg);
    e.reference = r.chosen;
    const int64_t n = static_cast<int64_t>(e.ids.size());
    if (n > P) {
      if (cfg.overflow == prompt_overflow::drop) {
        ++rep.filtered;
        continue;
      }
      // keep the end of the prompt (its last turn and "Assistant:"), and BOS first
      const int64_t head = head_of(e.ids, tok, cfg);
      std::vector<int32_t> cut(e.ids.begin(), e.ids.begin() + head);
      cut.insert(cut.end(), e.ids.end() - (P - head), e.ids.end());
      e.ids = std::move(cut);
      e.truncated = true;
      ++rep.truncated;
    }
    rep.max_len = std::max<int64_t>(rep.max_len, static_cast<int64_t>(e.ids.size()));
    sum += static_cast<double>(e.ids.size());
    out.push_back(std::move(e));
  }
  rep.kept = static_cast<int64_t>(out.size());
  rep.mean_len = out.empty() ? 0 : sum / static_cast<double>(out.size());
  if (report) *report = rep;
  return out;
}

// ---- batches ---------------------------------------------------------------

sft_batch_data sft_batch(const std::vector<sft_example>& examples, const std::vector<int64_t>& indices,
                         bool mask_prompt, int64_t pad_to, int32_t pad_id) {
  check_indices("sft_batch", examples.size(), indices);
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max<int64_t>(longest, static_cast<int64_t>(examples[i].ids.size()));
  sft_batch_data b;
  b.B = static_cast<int64_t>(indices.size());
  b.T = batch_width("sft_batch", longest, pad_to);
  const int64_t B = b.B, T = b.T;
  std::vector<int32_t> ids(B * T, pad_id), mask(B * T, 0), labels(B * T, -100), targets(B * T, -100), lens(B);
  for (int64_t r = 0; r < B; ++r) {
    const auto& e = examples[static_cast<size_t>(indices[static_cast<size_t>(r)])];
    const int64_t n = static_cast<int64_t>(e.ids.size());
    lens[r] = i32(n);
    for (int64_t t = 0; t < n; ++t) {
      ids[r * T + t] = e.ids[t];
      mask[r * T + t] = 1;
      if (!(mask_prompt && t < e.prompt_len)) labels[r * T + t] = e.ids[t];
    }
    for (int64_t t = 0; t + 1 < T; ++t) targets[r * T + t] = labels[r * T + t + 1];
  }
  for (int32_t v : targets) b.n_target_tokens += v != -100;
  b.ids = tensor::from_ints({B, T}, ids);
  b.mask = tensor::from_ints({B, T}, mask);
  b.labels = tensor::from_ints({B, T}, labels);
  b.targets = tensor::from_ints({B, T}, targets);
  b.lengths = tensor::from_ints({B}, lens);
  return b;
}

rm_batch_data rm_batch(const std::vector<rm_example>& examples, const std::vector<int64_t>& indices, int64_t pad_to,
                       int32_t pad_id) {
  check_indices("rm_batch", examples.size(), indices);
  int64_t longest = 0;
  for (int64_t i : indices)
    longest = std::max<int64_t>({longest, static_cast<int64_t>(examples[i].chosen.size()),
                                 static_cast<int64_t>(examples[i].rejected.size())});
  rm_batch_data b;
  b.B = static_cast<int64_t>(indices.size());
  b.T = batch_width("rm_batch", longest, pad_to);
  const int64_t B = b.B, T = b.T;
  std::vector<int32_t> cid(B * T, pad_id), rid(B * T, pad_id), cm(B * T, 0), rm(B * T, 0), cl(B), rl(B), cp(B), rp(B);
  for (int64_t r = 0; r < B; ++r) {
    const auto& e = examples[static_cast<size_t>(indices[static_cast<size_t>(r)])];
    cl[r] = i32(static_cast<int64_t>(e.chosen.size()));
    rl[r] = i32(static_cast<int64_t>(e.rejected.size()));
    cp[r] = i32(e.chosen_prompt_len);
    rp[r] = i32(e.rejected_prompt_len);
    for (size_t t = 0; t < e.chosen.size(); ++t) {
      cid[r * T + static_cast<int64_t>(t)] = e.chosen[t];
      cm[r * T + static_cast<int64_t>(t)] = 1;
    }
    for (size_t t = 0; t < e.rejected.size(); ++t) {
      rid[r * T + static_cast<int64_t>(t)] = e.rejected[t];
      rm[r * T + static_cast<int64_t>(t)] = 1;
    }
  }
  b.chosen_ids = tensor::from_ints({B, T}, cid);
  b.rejected_ids = tensor::from_ints({B, T}, rid);
  b.chosen_mask = tensor::from_ints({B, T}, cm);
  b.rejected_mask = tensor::from_ints({B, T}, rm);
  b.chosen_len = tensor::from_ints({B}, cl);
  b.rejected_len = tensor::from_ints({B}, rl);
  b.chosen_prompt_len = tensor::from_ints({B}, cp);
  b.rejected_prompt_len = tensor::from_ints({B}, rp);
  return b;
}

prompt_batch_data prompt_batch(const std::vector<prompt_example>& examples, const std::vector<int64_t>& indices,
                               int64_t pad_to, int32_t pad_id) {
  check_indices("prompt_batch", examples.size(), indices);
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max<int64_t>(longest, static_cast<int64_t>(examples[i].ids.size()));
  prompt_batch_data b;
  b.B = static_cast<int64_t>(indices.size());
  b.P = batch_width("prompt_batch", longest, pad_to);
  const int64_t B = b.B, P = b.P;
  std::vector<int32_t> ids(B * P, pad_id), mask(B * P, 0), lens(B);
  for (int64_t r = 0; r < B; ++r) {
    const auto& e = examples[static_cast<size_t>(indices[static_cast<size_t>(r)])];
    const int64_t n = static_cast<int64_t>(e.ids.size());
    lens[r] = i32(n);
    for (int64_t t = 0; t < n; ++t) {
      ids[r * P + (P - n) + t] = e.ids[static_cast<size_t>(t)];
      mask[r * P + (P - n) + t] = 1;
    }
  }
  b.ids = tensor::from_ints({B, P}, ids);
  b.mask = tensor::from_ints({B, P}, mask);
  b.lengths = tensor::from_ints({B}, lens);
  return b;
}

}  // namespace flowrun::dschat
