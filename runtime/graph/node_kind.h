// Layer 4, graph description: node kinds and their registry.
//
// A node kind describes what a `[node.NAME]` table with `kind = "..."` may
// contain: its ports (name, message type, direction, required, feedback) and
// its settings (name, type, default, doc, required). The validator checks a
// graph_spec against these declarations. The kinds themselves are registered
// by the layer that implements them (actors/); this layer only keeps the
// declarations, prints them (`flowrun kinds`, `flowrun explain KIND`) and
// offers a few demo kinds for the example pipeline (register_example_kinds).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/graph/graph_spec.h"

namespace flowrun::graph {

/// Whether a port receives (in) or emits (out) messages.
enum class port_dir { in, out };

/// "in" or "out".
std::string_view to_string(port_dir d);

/// One port of a node kind. Edges connect an out port to an in port whose
/// message_type is the same string (e.g. "tokens", "rollouts").
struct port_decl {
  std::string name;
  std::string message_type;
  port_dir dir = port_dir::in;
  /// The graph is invalid unless the port has at least one edge.
  bool required = true;
  /// In ports only: edges into this port close cycles (their messages come
  /// from a later step, so a cycle through them can make progress).
  bool feedback = false;
  std::string doc;
};

/// The type of a setting. A float setting also accepts an integer literal.
/// Paths (see validate.h, "Path settings", for the one rule they follow):
/// - path: a file or folder the node reads; it must exist;
/// - path_list: a list of such inputs;
/// - output: a file or folder the node writes; it need not exist yet.
/// Validation turns every path into an absolute one, so nodes never resolve
/// a relative path themselves.
enum class setting_type { int_, float_, bool_, string, path, string_list, output, path_list };

/// "int", "float", "bool", "string", "path", "string_list", "output" or "path_list".
std::string_view to_string(setting_type t);

/// Parses the spelling above; nullopt for anything else.
std::optional<setting_type> parse_setting_type(std::string_view s);

/// True when `v` is an acceptable value for a setting of type `t` (an int is
/// accepted for float; a string for string and path).
bool value_matches(setting_type t, const setting_value& v);

/// The values a numeric (int or float) setting accepts. Bounds are inclusive
/// unless marked open; an absent bound leaves that side unbounded. A float
/// setting is finite by default: NaN and +-inf are refused unless
/// allow_nonfinite is set. The validator (validate.h) refuses a value outside
/// the range at its file:line:col; `flowrun explain KIND` prints it.
struct setting_range {
  std::optional<double> low, high;
  bool low_open = false;   ///< low itself is refused (value > low)
  bool high_open = false;  ///< high itself is refused (value < high)
  bool non_zero = false;   ///< 0 is refused
  bool allow_nonfinite = false;  ///< float only: NaN and +-inf are accepted
  std::string why;         ///< why the bound is what it is (shown in errors); may be empty

  /// True when nothing is restricted beyond finiteness.
  bool unbounded() const { return !low && !high && !non_zero; }
};

/// The range in words, as errors and `flowrun explain` print it: "in (0, 1]",
/// ">= 1", "finite, >= 0", "!= 0"; "" for an unrestricted int setting. For a
/// float setting "finite" comes first unless NaN/inf are allowed.
std::string describe_range(const setting_range& r, setting_type t);

/// One setting of a node kind. A required setting has no default
/// (default_value holds monostate); an optional one must have a default of
/// its type (a string default "" is allowed for path: it means "not set" and
/// is not checked for existence). Int and float settings have a range
/// (setting_range; finite floats only, by default).
struct setting_decl {
  std::string name;
  setting_type type = setting_type::string;
  setting_value default_value;
  std::string doc;
  bool required = false;
  setting_range range;
  /// Optional: the default when it depends on the node's other settings (node_kind::default_by), e.g. the
  /// experience maker's kl_ctl, whose field default differs per advantage_estimator. Unset: default_value.
  std::function<setting_value(const node_spec& node)> default_for;
};

/// Why `v` (a value of `d`'s type, an int or a float) is outside `d`'s range,
/// e.g. "must be >= 1, got 0" or "must be finite, got nan"; nullopt when it is
/// inside it, or when `d` is not numeric or `v` is not a number.
std::optional<std::string> range_violation(const setting_decl& d, const setting_value& v);

/// A node kind: its name, a one-line doc, ports and settings. The builder
/// methods append declarations and return *this, so a kind reads as
///   node_kind{"tokenizer", "text to token ids"}
///       .input("text", "text").output("tokens", "tokens")
///       .require("model", setting_type::path, "tokenizer model")
///       .option("add_bos", setting_type::bool_, true, "prepend BOS");
struct node_kind {
  node_kind() = default;
  /// A kind called `kind_name` with a one-line description and no ports or settings yet.
  explicit node_kind(std::string kind_name, std::string kind_doc = {})
      : name(std::move(kind_name)), doc(std::move(kind_doc)) {}

  std::string name;
  std::string doc;
  std::vector<port_decl> ports;
  std::vector<setting_decl> settings;
  /// The kind's handlers block (e.g. in collectives with other replicas, as a
  /// ZeRO rank does): each replica then runs on a thread of its own rather than
  /// on the shared scheduler, so blocked replicas cannot starve the others.
  bool blocking = false;
  /// Non-empty: the kind runs as one replica only, and this says why (the validator's error for
  /// replicas > 1 quotes it, e.g. a trainer whose copies would train the same rows and write the
  /// same files).
  std::string single_replica;

  /// A problem that check() found: the setting it is about (empty: the node), what
  /// is wrong and how to fix it.
  struct problem {
    std::string setting;
    std::string message;
    std::string hint;
  };
  /// Optional: a check of the node against the rest of the graph that the
  /// declarations cannot express (e.g. that a trainer's output can be written in
  /// the format of the model its edges bring). validate() calls it on the
  /// resolved spec once every other check passed, and only when it checks files
  /// (check may read them); each problem becomes an error at the setting. Must
  /// not throw.
  std::function<std::vector<problem>(const node_spec& node, const graph_spec& graph)> check;
  /// Optional, for a kind that keeps its checkpoints in a folder of its own (pretraining's
  /// zero_rank and lm_batches in output_dir, not [graph] checkpoint_dir): whether this node will
  /// resume an earlier run's checkpoint. A run resumes when [graph] checkpoint_dir holds something or
  /// any node's resumes() is true; its --metrics file is then appended to, not started again
  /// (runtime.cpp, run_graph). Must not throw.
  std::function<bool(const node_spec& node)> resumes;
  /// Setting names of other tools (veRL, TRL, DeepSpeed) that this kind spells otherwise, with
  /// what to write here: an unknown setting of such a name gets that hint instead of "did you
  /// mean" (veRL's clip_ratio was offered clip_ratio_c, the dual clip). Added by known_as().
  std::map<std::string, std::string, std::less<>> other_names;

  /// Appends an in port (required unless told otherwise).
  node_kind& input(std::string port, std::string message_type, std::string port_doc = {}, bool required = true,
                   bool feedback = false);
  /// Appends an out port (optional unless told otherwise).
  node_kind& output(std::string port, std::string message_type, std::string port_doc = {}, bool required = false);
  /// Appends an optional setting with its default. An integer default of a
  /// float setting is stored as a float.
  node_kind& option(std::string setting_name, setting_type type, setting_value default_value, std::string setting_doc);
  /// Appends a required setting (no default).
  node_kind& require(std::string setting_name, setting_type type, std::string setting_doc);

  /// Range modifiers: each restricts the setting declared just before it (an
  /// int or float setting), so a declaration reads
  ///   .option("print_every", T::int_, 10, "...").at_least(1)
  ///   .option("top_p", T::float_, 1.0, "...").in_range(0, 1, /*low_open=*/true)
  /// They throw std::invalid_argument (a programmer error) when there is no
  /// setting yet or it is not numeric; register_kind checks that the default
  /// lies inside the range.
  node_kind& at_least(double low);  ///< value >= low
  node_kind& above(double low);     ///< value > low
  node_kind& at_most(double high);  ///< value <= high
  node_kind& below(double high);    ///< value < high
  /// low <= value <= high, either end open (excluded) when told.
  node_kind& in_range(double low, double high, bool low_open = false, bool high_open = false);
  node_kind& non_zero();         ///< value != 0
  node_kind& allow_nonfinite();  ///< a float setting that accepts NaN and +-inf
  /// Why the range is what it is, added to errors (e.g. a bound tied to the machine).
  node_kind& because(std::string why);
  /// The setting declared just before it takes its default from `f` when the graph does not write it:
  /// validate() calls f(node) once every other setting of the node has its value (written, or its
  /// kind's default_value) and range, and stores the result, marked from_default. f must return a value
  /// of the setting's type inside its range for any node (fall back to default_value for values it does
  /// not know); validate() reports a violation as an error at the node. default_value stays the one
  /// `flowrun explain` shows, so the doc should name the other defaults.
  node_kind& default_by(std::function<setting_value(const node_spec& node)> f);

  /// Another tool's name for a setting of this kind, and the hint an unknown setting of that name
  /// gets (other_names), e.g. .known_as("clip_ratio", "veRL's clip_ratio is cliprange here").
  node_kind& known_as(std::string foreign_name, std::string hint);

  /// The port called `port`, or nullptr.
  const port_decl* find_port(std::string_view port) const;
  /// The setting called `setting_name`, or nullptr.
  const setting_decl* find_setting(std::string_view setting_name) const;
  /// The in (or out) ports, in declaration order.
  std::vector<const port_decl*> ports_of(port_dir d) const;
  /// The names of the settings (for "did you mean" hints).
  std::vector<std::string> setting_names() const;
  /// The names of the ports.
  std::vector<std::string> port_names() const;
};

/// Setting names a node table reserves for itself; no kind may declare them.
inline constexpr std::string_view reserved_node_keys[] = {"kind", "replicas", "on", "threads"};

/// The registry of node kinds, by name.
class node_kind_registry {
 public:
  /// Adds a kind. Throws std::invalid_argument (a programmer error) if the
  /// name is taken or not an identifier, if two ports or two settings share
  /// a name, if a setting uses a reserved name (kind, replicas, on), if a
  /// default does not match its type, if a required setting has a default,
  /// if a range is empty (low > high) or set on a non-numeric setting, if a
  /// default lies outside its setting's range, or if an out port is flagged
  /// feedback.
  void register_kind(node_kind kind);

  /// The kind called `name`, or nullptr.
  const node_kind* lookup(std::string_view name) const;

  /// Every kind, sorted by name.
  std::vector<const node_kind*> list() const;

  /// Every kind's name, sorted.
  std::vector<std::string> names() const;

  std::size_t size() const { return kinds_.size(); }

 private:
  std::map<std::string, node_kind, std::less<>> kinds_;
};

/// The hint for an unknown setting `setting_name` written on node `node` of kind `kind`, before a "did you
/// mean": another tool's name for one of the kind's settings (node_kind::other_names: "veRL's clip_ratio is
/// cliprange here"); else, when none of `valid` (the names the caller suggests from) is near, the other
/// nodes of `graph` whose kind has it ("'loss_agg_mode' is a setting of [node.policy] (kind policy): write
/// it there"). Empty otherwise: the caller's "did you mean" or list of valid names. The graph file's
/// validator and --set use it alike.
std::string unknown_setting_hint(const graph_spec& graph, const node_kind_registry& kinds, const node_kind& kind,
                                 std::string_view setting_name, std::string_view node,
                                 const std::vector<std::string>& valid);

/// The one rule relative paths follow (validate.h, "Path settings"), as
/// `flowrun explain` prints it under every kind that has path settings.
std::string path_rule_text();

/// A multi-line description of a kind for `flowrun explain KIND`: its doc,
/// then its in ports, out ports and settings (type, default or "required",
/// doc, and the range in brackets when there is one, e.g. "[>= 1]"), one
/// per line, then path_rule_text() when the kind has path settings; ends
/// with a newline.
std::string explain(const node_kind& kind);

/// One line per kind for `flowrun kinds`: name, ports in short form and doc.
std::string describe_kinds(const node_kind_registry& registry);

/// Registers the demo kinds the example pipeline (graphs/examples/
/// generate.graph) uses: text_source, tokenizer, generator and sink. They are
/// declarations only; the actors that run them live in actors/. Throws
/// std::invalid_argument if any of them is registered already.
void register_example_kinds(node_kind_registry& registry);

}  // namespace flowrun::graph
