#include "actors/register.h"

#include "actors/message_types.h"
#include "runtime/actor/payload_codec.h"

#include <map>
#include <stdexcept>

namespace flowrun::actors {

void register_example_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  using T = graph::setting_type;
  // "text" and "tokens" may cross cluster nodes as bytes (docs/scaling.md).
  actor::register_payload_codec(std::string(text_type), actor::string_codec());
  actor::register_payload_codec(std::string(tokens_type), actor::pod_vector_codec<std::int32_t>());
  // The graph layer owns the declarations; copy them and add what the runtime needs.
  graph::node_kind_registry declared;
  graph::register_example_kinds(declared);
  const std::map<std::string, actor::node_factory> impls = {
      {"text_source", make_text_source},
      {"tokenizer", make_tokenizer},
      {"generator", make_generator},
      {"sink", make_sink},
  };
  for (const graph::node_kind* k : declared.list()) {
    auto it = impls.find(k->name);
    if (it == impls.end()) continue;  // a declaration without an implementation here
    graph::node_kind kind = *k;
    if (kind.name == "generator") {
      if (!kind.find_setting("batch_size"))
        kind.option("batch_size", T::int_, std::int64_t{4},
                    "prompts generated together; a partial batch is generated when the input ends")
            .at_least(1);
      if (!kind.find_setting("include_prompt"))
        kind.option("include_prompt", T::bool_, true, "emit the prompt followed by its completion (false: the completion only)");
    }
    actor::register_node_kind(kinds, factories, std::move(kind), it->second);
  }
}

void register_builtin_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  register_example_nodes(kinds, factories);
  register_rlhf_nodes(kinds, factories);
  register_zero_nodes(kinds, factories);
}

}  // namespace flowrun::actors
