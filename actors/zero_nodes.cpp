// TencentPretrain-style pretraining with ZeRO as node kinds (docs/zero.md):
//
//   lm_batches   the data loader: documents tokenized, concatenated and cut to
//                seq_length (TencentPretrain's LM target); one global batch per
//                step, broadcast to every rank
//   zero_rank    a shard owner: one replica per rank (a thread of its own: it
//                blocks in collectives), holding its 1/N of the fp32 master
//                parameters and AdamW moments (ZeRO stage 1-3) and training
//                its rows of each global batch; checkpoints its shard.
//
// A run over several processes (gloo) starts the same graph in each process
// (`flowrun launch --nproc P`): process p hosts ranks p·R .. p·R + R - 1 of the
// R = replicas ranks per process.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <fstream>
#include <set>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/node_models.h"
#include "actors/codec_io.h"
#include "actors/dschat_common.h"
#include "actors/rank_group.h"
#include "runtime/util/dir_lock.h"
#include "runtime/util/same_path.h"
#include "actors/register.h"
#include "actors/resume_check.h"
#include "models/adapter.h"
#include "models/train/engine_checkpoint.h"
#include "models/checkpoint.h"
#include "models/train/ds_config.h"
#include "models/hf.h"
#include "models/lm_data.h"
#include "models/train/shard_checkpoint.h"
#include "models/tokenizer.h"
#include "models/train/zero.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

using clk = std::chrono::steady_clock;

/// Message type "lm_batch": one global batch of LM instances and the data
/// position after it (for checkpoints).
struct lm_batch_msg {
  int64_t step = 0;  ///< 1-based optimizer step this batch is for
  tensor ids, targets;  ///< (B_global, T) i32
  int64_t epoch = 0, cursor = 0;
  tensor val_ids, val_targets;  ///< the held-out batch (the same tensors in every message)
};

/// The latest committed checkpoint of `dir`, or "" (no dir, nothing committed).
std::string resume_folder(const std::string& dir, std::string* note = nullptr) {
  if (dir.empty() || !std::filesystem::exists(dir)) return {};
  return latest_checkpoint(dir, note);
}

// ---------------------------------------------------------------- lm_batches

class lm_batches final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    if (const auto& dir = s.get_string("output_dir"); !dir.empty())  // one run writes it (runtime/util/dir_lock.h)
      out_lock_ = dir_lock::acquire(dir, ctx.run_id(), "node '" + ctx.name() + "' output_dir");
    tok_ = load_tokenizer(resolve_user_path(s.get_string("tokenizer"), "tokenizer").string());
    data_ = std::make_unique<lm_dataset>(resolve_user_path(s.get_string("data"), "data").string(), *tok_,
                                         s.get_int("seq_length"), 0.05,
                                         s.get_bool("document_per_line") ? document_split::lines
                                                                         : document_split::blank_lines);
    data_->set_seed(static_cast<uint64_t>(s.get_int("seed")));
    batch_ = s.get_int("train_batch_size");
    total_ = s.get_int("total_steps");
    if (batch_ < 1 || total_ < 1)
      throw std::invalid_argument("node '" + ctx.name() + "': train_batch_size and total_steps must be >= 1");
    ctx.log().info("{} tokens -> {} training instances of {} tokens (+{} held out)", data_->num_tokens(),
                   data_->num_train(), data_->seq_length(), data_->num_val());
    // the held-out instances: eval_rows of them, rounded down to a multiple of 8 from 8 up (the figure of a
    // run on 1, 2, 4 or 8 ranks is then over the same rows however many ranks it resumes on), else all
    // of the 1-7 asked for (zero_engine::eval_loss splits any count over the ranks)
    int64_t nv = std::min<int64_t>(s.get_int("eval_rows"), data_->num_val());
    if (nv >= 8) nv = nv / 8 * 8;
    if (nv > 0) data_->val_batch(0, nv, val_ids_, val_targets_);
  }

  bool produce(actor::node_context& ctx) override {
    if (!positioned_) position(ctx);
    if (step_ >= total_) return false;
    lm_batch_msg m;
    data_->next_batch(batch_, m.ids, m.targets);
    m.step = ++step_;
    m.epoch = data_->epoch();
    m.cursor = data_->cursor();
    m.val_ids = val_ids_;
    m.val_targets = val_targets_;
    ctx.metric("tokens_cut", m.ids.numel());  // the ranks count the tokens they train on (metrics_snapshot::tokens)
    ctx.emit("batch", actor::payload::make("lm_batch", std::move(m)));
    return true;
  }

 private:
  // Resume: continue after the committed checkpoint's step, at its data position. The data's settings
  // (the file and the tokenizer by their contents, seq_length, seed) are recorded in
  // OUTPUT_DIR/NAME.settings.json and a resume compares them: another data file or data order was taken
  // without a word, at the saved cursor (zero_rank's record holds its own settings only). A checkpoint from
  // before the record is accepted and recorded from now. The schedule's length, the global batch (zero_rank
  // checks it) and the held-out rows may change.
  void position(actor::node_context& ctx) {
    positioned_ = true;
    const auto& s = ctx.spec();
    const std::string dir = s.get_string("output_dir");
    if (dir.empty()) return;
    const std::string folder = s.get_bool("resume") ? resume_folder(dir) : "";
    const std::string rec_path = (std::filesystem::path(dir) / (ctx.name() + ".settings.json")).string();
    static const std::set<std::string> safe = {"total_steps", "train_batch_size", "eval_rows", "output_dir", "resume"};
    if (!folder.empty() && std::filesystem::exists(rec_path)) {
      nlohmann::json recorded;
      try {
        std::ifstream f(rec_path);
        recorded = nlohmann::json::parse(f);
      } catch (const std::exception& e) {
        throw std::runtime_error(rec_path + " is not a settings record (" + e.what() +
                                 "): delete it to take this run's data settings as the checkpoint's");
      }
      check_resume_settings(ctx, recorded, rec_path, safe, "point output_dir elsewhere or set resume = false");
    }
    if (process_index() == 0) {  // one writer: under flowrun launch every process runs this node on one folder
      std::filesystem::create_directories(dir);
      write_text_atomic(rec_path, settings_record(ctx.spec(), safe).dump(1) + "\n");
    }
    if (folder.empty()) return;
    auto ck = verify_checkpoint(folder);
    const auto& m = ck.manifests.at(0);
    data_->set_position(m.data_epoch, m.data_cursor);
    step_ = m.step;
    ctx.print(fmt::format("[pretrain] resuming after step {} from {}", step_, folder));
  }

  std::unique_ptr<tokenizer> tok_;
  std::unique_ptr<lm_dataset> data_;
  dir_lock out_lock_;  // output_dir's writer lock, held while the node lives
  tensor val_ids_, val_targets_;
  int64_t batch_ = 0, total_ = 0, step_ = 0;
  bool positioned_ = false;
};

// ---------------------------------------------------------------- zero_rank

class zero_rank final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    rank_group g = join_rank_group(ctx);
    world_ = g.world;
    rank_ = g.rank;
    rendezvous_ = std::move(g.rendezvous);  // kept while the group lives (rank_group::rendezvous)
    comm_ = std::move(g.comm);
    abortable_ = std::move(g.abortable);
    // a rank that refuses now (a resume whose settings changed) fails its peers' first collective now
    aborting_on_failure(comm_.get(), [&] { start_rank(ctx, g.local_ranks); });
  }

  // start() once this replica has joined its rank group (`local`: the group's ranks in this process)
  void start_rank(actor::node_context& ctx, int local) {
    const auto& s = ctx.spec();
    // the host's cores shared among the ranks of all launched processes (one thread each)
    ctx.thread_budget(std::max(1, ops::hardware_threads() / world_));

    // DeepSpeed's config
    ds_ = load_node_ds_config(ctx, s.get_string("deepspeed_config"), world_, rank_ == 0);
    if (s.get_int("zero_stage") >= 0) ds_.zero_stage = static_cast<int>(s.get_int("zero_stage"));
    if (ds_.bf16) zs_.precision = dtype::bf16;
    if (ds_.fp16) {
      zs_.precision = dtype::f16;
      zs_.loss_scaler = std::make_shared<dynamic_loss_scaler>(ds_);
    }
    zs_.stage = ds_.zero_stage;
    zs_.micro_batch = ds_.train_micro_batch_size_per_gpu;
    zs_.gradient_accumulation_steps = ds_.gradient_accumulation_steps;
    zs_.gradient_clipping = ds_.gradient_clipping;
    zs_.adamw.lr = static_cast<float>(ds_.lr);
    zs_.adamw.beta1 = static_cast<float>(ds_.beta1);
    zs_.adamw.beta2 = static_cast<float>(ds_.beta2);
    zs_.adamw.eps = static_cast<float>(ds_.eps);
    zs_.adamw.weight_decay = static_cast<float>(ds_.weight_decay);

    // the model: the full initial weights (every rank reads the same file)
    model_ = std::make_unique<decoder>(load_node_model(ctx, resolve_user_path(s.get_string("model"), "model").string()));
    // rows longer than the model's context: every rank failed at its first forward ("decoder::forward: T = 600
    // exceeds max_seq_len 512"), naming no setting
    if (const int64_t ctx_len = model_->config().max_seq_len; s.get_int("seq_length") > ctx_len)
      throw std::invalid_argument(fmt::format(
          "node '{}': seq_length = {} is past the context of {} ({} positions, max_seq_len): set seq_length to at "
          "most {} on this node and its data node",
          ctx.name(), s.get_int("seq_length"), s.get_string("model"), ctx_len, ctx_len));
    // the end-of-run outputs, checked now rather than after training (save_problem writes nothing)
    for (const char* k : {"export_hf", "save_lora"})
      if (const auto& out = s.get_string(k); !out.empty() && rank_ == 0)
        if (auto why = save_problem(model_format::hf, out, model_->config().family, false); !why.empty())
          throw std::invalid_argument(fmt::format("node '{}': {} {}", ctx.name(), k, why));
    if (s.get_bool("use_lora")) {
      // the seed is the same on every rank: the adapter is replicated
      const lora_config lc = make_lora_config(s.get_int("lora_r"), static_cast<float>(s.get_float("lora_alpha")),
                                              static_cast<float>(s.get_float("lora_dropout")),
                                              s.get_string("lora_target_modules"), static_cast<uint64_t>(s.get_int("seed")));
      if (const auto& p = s.get_string("lora_pretrained"); !p.empty()) {
        // base + LoRA: the adapter's own adapter_config.json sets r, alpha, dropout and targets
        try {
          load_adapter(*model_, resolve_user_path(p, "lora_pretrained").string(), /*freeze_base=*/true);
        } catch (const std::runtime_error& e) {  // the setting first: the adapter's words name files and tensors
          throw std::invalid_argument(fmt::format("node '{}': lora_pretrained = \"{}\": {}", ctx.name(), p, e.what()));
        }
        // a LoRA setting written in the graph or with --set that the adapter contradicts would be
        // silently replaced by the adapter's: refused, naming both (defaults are not the user's word)
        const lora_config& got = model_->lora();
        std::vector<std::string> differ;
        auto written = [&](const char* k) { return !s.settings.at(k).from_default; };
        if (written("lora_r") && lc.lora_r != got.lora_r)
          differ.push_back(fmt::format("lora_r = {} (the adapter's r: {})", lc.lora_r, got.lora_r));
        if (written("lora_alpha") && lc.lora_alpha != got.lora_alpha)
          differ.push_back(fmt::format("lora_alpha = {} (the adapter's: {})", lc.lora_alpha, got.lora_alpha));
        if (written("lora_target_modules") && !same_target_modules(lc, got))
          differ.push_back(fmt::format("lora_target_modules = {} (the adapter's: {})", fmt::join(lc.target_modules, ","),
                                       fmt::join(got.target_modules, ",")));
        if (!differ.empty())
          throw std::invalid_argument(fmt::format(
              "node '{}': lora_pretrained {} was trained with other LoRA settings than those given: {}; its "
              "adapter_config.json sets them, so remove these settings (or give them the adapter's values)",
              ctx.name(), p, fmt::join(differ, "; ")));
        // lora_dropout may differ from the adapter's (TencentPretrain's --lora_dropout beside
        // --lora_pretrained_model_path): it shapes training, not what the weights mean; the node's seed draws the masks
        const float dropout = written("lora_dropout") ? lc.lora_dropout : got.lora_dropout;
        if (rank_ == 0 && dropout != got.lora_dropout)
          ctx.print(fmt::format("[pretrain] lora_dropout = {} (the adapter {} was trained with {})", dropout, p,
                                got.lora_dropout));
        model_->set_lora_dropout(dropout, lc.seed);
        if (rank_ == 0) ctx.print(fmt::format("[pretrain] continuing from base + LoRA adapter {}", p));
      } else {
        try {
          model_->enable_lora(lc, true);
        } catch (const std::invalid_argument& e) {  // name the setting: the decoder speaks of target modules
          std::string why = e.what();
          if (why.rfind("enable_lora: ", 0) == 0) why.erase(0, 13);
          throw std::invalid_argument(fmt::format("node '{}': lora_target_modules = \"{}\": {}", ctx.name(),
                                                  s.get_string("lora_target_modules"), why));
        }
      }
    }
    model_->set_gradient_checkpointing(s.get_bool("gradient_checkpointing"));
    // the memory plan, before anything big is allocated (actors/dschat_common.h: the trainers' one planner)
    memory_plan plan;
    plan.micro_batch = zs_.micro_batch;
    plan.seq_len = s.get_int("seq_length");
    plan.world_size = world_;
    plan.stage = zs_.stage;
    plan.precision = zs_.precision;
    auto est = check_memory_plan(ctx, *model_, plan, local,
                                 {"train_micro_batch_size_per_gpu", "seq_length", "zero_optimization.stage (zero_stage)",
                                  "use_lora", "gradient_checkpointing"});
    est.rank = rank_;
    if (rank_ == 0) ctx.print("[pretrain] memory estimate per rank: " + est.str());

    engine_ = std::make_unique<zero_engine>(*model_, *comm_, zs_);
    out_dir_ = s.get_string("output_dir");
    if (!out_dir_.empty())  // one run writes it (runtime/util/dir_lock.h)
      out_lock_ = dir_lock::acquire(out_dir_, ctx.run_id(), "node '" + ctx.name() + "' output_dir");
    console_reaches_ = all_replicas_here(ctx);
    if (s.get_bool("resume")) {
      std::string note;  // `latest` missing or naming a folder that is gone: which folder was taken
      if (auto f = resume_folder(out_dir_, &note); !f.empty()) {
        if (rank_ == 0 && !note.empty()) ctx.print("[pretrain] " + note);
        restore(ctx, f);
      }
    }
    total_ = s.get_int("total_steps");
    // DeepSpeed's decaying schedules reach their end at total_num_steps and stay there (lr 0 for
    // WarmupDecayLR): the steps past it train at that rate, as in DeepSpeed, but say so
    if (const std::string past = ds_.scheduler.past_end(total_, ds_.lr); rank_ == 0 && !past.empty())
      ctx.log().warn("total_steps = {} but {}, as in DeepSpeed; set scheduler.params.total_num_steps to {}", total_,
                     past, total_);
    t0_ = clk::now();
  }

  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    aborting_on_failure(comm_.get(), [&] { handle(ctx, port, std::move(msg)); });
  }

  void handle(actor::node_context& ctx, std::string_view, actor::payload msg) {
    const auto& b = msg.as<lm_batch_msg>();
    if (b.step <= done_) return;  // already in the checkpoint we resumed from
    if (!ids_checked_) {  // the data's tokenizer must be the model's: a larger one fails in the embedding
      ids_checked_ = true;
      const tensor ids = b.ids.to(device::cpu());
      const int32_t* p = ids.data<int32_t>();
      const int32_t top = ids.numel() ? *std::max_element(p, p + ids.numel()) : 0;
      if (top >= model_->config().vocab_size)
        throw std::invalid_argument(fmt::format(
            "node '{}': the data's tokens reach id {}, and the model's vocab_size is {}: the data node's tokenizer "
            "is not the model's; give the data node the tokenizer the model was trained with",
            ctx.name(), top, model_->config().vocab_size));
    }
    if (!evaluated_ && b.val_ids.defined() && b.val_ids.size(0) < world_) {
      evaluated_ = true;  // each rank's forward takes part in the collectives: it needs a row (a 3-rank run's 64 rows
                          // were once dropped without a word for not splitting evenly)
      if (rank_ == 0)
        ctx.log().warn("node '{}': {} held-out instance(s) cannot give each of the {} ranks one: no held-out loss "
                       "is measured; raise the data node's eval_rows to {} or more (and give it data that holds "
                       "out as many)",
                       ctx.name(), b.val_ids.size(0), world_, world_);
    }
    if (!evaluated_ && b.val_ids.defined()) {
      evaluated_ = true;
      val_ids_ = b.val_ids;
      val_targets_ = b.val_targets;
      // a resumed run keeps the figure from before the first step (its checkpoint holds it): measured
      // again at the resume point, the closing line set it against every update since step 1
      // eval_rows changed since the checkpoint (a safe setting): its figure is over other rows, so the closing
      // line would set one set of rows against another; measured again here, and said
      if (before_restored_ && before_rows_ > 0 && b.val_ids.size(0) != before_rows_) {
        before_restored_ = false;
        if (rank_ == 0)
          ctx.print(fmt::format("[pretrain] eval_rows changed since the checkpoint ({} -> {} held-out instances): "
                                "the held-out loss is measured again at the resume point",
                                before_rows_, b.val_ids.size(0)));
      }
      if (!before_restored_) {
        const double l = engine_->eval_loss(b.val_ids, b.val_targets);
        if (rank_ == 0)
          ctx.print(fmt::format("[pretrain] held-out loss {:.6f} before step {} ({} instances)", l, b.step,
                                b.val_ids.size(0)));
        before_ = l;
      }
    }
    const double lr = ds_.scheduler.lr_at(engine_->step_count(), ds_.lr);
    auto t = clk::now();
    auto r = engine_->train_step(b.ids, b.targets, lr);
    done_ = b.step;
    const double dt = std::chrono::duration<double>(clk::now() - t).count();
    if (r.skipped && rank_ == 0)
      ctx.print(fmt::format("[pretrain] step {}: fp16 gradients overflowed at loss scale {:g}: update skipped, "
                            "scale now {:g}",
                            b.step, r.loss_scale, zs_.loss_scaler->scale()));
    ctx.metric("steps");
    if (ctx.replica() == 0) {
      ctx.signal("loss", r.loss, b.step);
      ctx.signal("grad_norm", r.grad_norm, b.step);
      ctx.signal("lr", r.lr, b.step);
      ctx.signal("tokens_per_s", r.tokens / dt, b.step);
      ctx.progress("pretrain", b.step, total_);
    }
    const memory_report mem = engine_->memory();  // the console's memory per rank
    ctx.memory({{"params", mem.param_bytes}, {"gathered_peak", mem.gathered_peak_bytes}, {"grads", mem.grad_bytes}, {"optimizer", mem.optimizer_bytes}, {"activations", mem.activation_bytes}});
    if (rank_ == 0) {
      ctx.metric("tokens", r.tokens);
      if (b.step % ctx.spec().get_int("print_every") == 0 || b.step == total_ || b.step == 1)
        ctx.print(fmt::format("[pretrain] step {}/{} loss {:.6f} grad_norm {:.4f} lr {:.3e} comm {:.3f} MB/rank "
                              "({:.0f} tokens/s)",
                              b.step, total_, r.loss, r.grad_norm, r.lr, r.comm_bytes / 1e6, r.tokens / dt));
    }
    epoch_ = b.epoch;
    cursor_ = b.cursor;
    const int64_t every = ctx.spec().get_int("save_checkpoint_steps");
    const bool scheduled = every > 0 && (b.step % every == 0 || b.step == total_);
    // the closing held-out loss before the last checkpoint, which keeps it: a rerun of the finished run
    // gets no batch to measure it on, and says it again from there
    if (b.step == total_ && val_ids_.defined()) after_ = engine_->eval_loss(val_ids_, val_targets_);
    if (!out_dir_.empty() && (console_asked(ctx, b.step, scheduled) || scheduled)) save(ctx, b.step);
    if (b.step == total_) finish_run(ctx);
  }

  // The data ended. A resumed run that had done every step before gets no batch: its end of run
  // (the held-out loss is not known then; the export and the adapter are written) comes now, so
  // the same command with a fixed export path writes it.
  //
  // A drain (the first SIGINT or SIGTERM, the console's stop) ends here too, after the ranks trained every batch
  // in flight: the step they stopped at is committed, so that the same command resumes after it (a preempted
  // job's SIGTERM lost every step since save_checkpoint_steps' last, as DeepSpeed's does). Only where every rank
  // is in this process: across processes (flowrun launch, a cluster) each process drains on its own, and ranks
  // that had not agreed on the step would meet in other collectives; they keep the last commit.
  void finish(actor::node_context& ctx) override {
    if (!finished_ && done_ > 0 && done_ >= total_) {
      finish_run(ctx);
    } else if (ctx.draining() && !finished_ && done_ < total_ && console_reaches_ && !out_dir_.empty() &&
               done_ > committed_) {
      if (rank_ == 0) ctx.print(fmt::format("[pretrain] stopping at step {}: committing it", done_));
      aborting_on_failure(comm_.get(), [&] { save(ctx, done_); });
    }
  }

  void stop(actor::node_context& ctx) override {
    // SIGINT: say what is kept (a run whose last step was done as the signal came said "interrupted ... resumes there")
    if (ctx.reason() != actor::stop_reason::interrupted || rank_ != 0 || finished_) return;
    const std::string last = out_dir_.empty() ? std::string() : resume_folder(out_dir_);
    ctx.print(last.empty() ? fmt::format("[pretrain] interrupted after step {}: no checkpoint was saved{}", done_,
                                         out_dir_.empty() ? " (output_dir is empty)" : "")
                           : fmt::format("[pretrain] interrupted after step {}: the last committed checkpoint is {}; the "
                                         "same command resumes there",
                                         done_, last));
  }

 private:
  // Settings a resume may change (a longer run, another rank count, stage or placement, other
  // printing, saving and export); the data, seq_length, the optimizer (the DeepSpeed JSON) and
  // LoRA may not.
  static const std::set<std::string>& safe_to_change() {
    static const std::set<std::string> safe = {
        "total_steps",     "zero_stage",       "save_checkpoint_steps", "keep_checkpoints", "export_hf", "save_lora",
        "memory_limit_gb", "gradient_checkpointing", "print_every", "resume", "output_dir",
        std::string(ds_batch_split_safe)};  // the global batch is checked in restore()
    return safe;
  }

  std::string config_hash() const {
    nlohmann::json j = model_->config();
    j["zero_lora"] = model_->has_lora();
    return config_fingerprint(j);
  }

  // Whether the console's POST /api/checkpoint asks for a checkpoint after this step (every rank calls
  // it at every step). In one process every rank sees the request and the first to see it fixes the
  // step (all_replicas_here). Across processes (flowrun launch, cluster nodes) a request lives
  // in the process whose console took it (a cluster node learns main's with the next counter poll):
  // the ranks agree by an all_reduce (max) of the latest request each knows, so all of them checkpoint
  // at one step, once per request; before, a request taken by one process's ranks alone hung the
  // others' next collective until comm_timeout_s. A scheduled checkpoint (save_checkpoint_steps)
  // honours a request seen at its step in one process; across processes the agreement still runs
  // then, so every rank calls the same collectives.
  bool console_asked(actor::node_context& ctx, int64_t step, bool scheduled) {
    if (console_reaches_) return !scheduled && ctx.checkpoint_requested(step);
    const std::uint64_t known = ctx.checkpoint_generation();
    auto g = tensor::from_ints({1}, {static_cast<int32_t>(known)}).to(comm_->tensor_device());
    comm_->all_reduce(g, comm::reduce_op::max);
    const auto agreed = static_cast<std::uint64_t>(g.to(device::cpu()).data<int32_t>()[0]);
    if (agreed <= agreed_request_) return false;
    agreed_request_ = agreed;
    if (known == agreed) ctx.checkpoint_requested();  // a request of this process: counted honoured here
    if (rank_ == 0) ctx.log().info("honouring the console's checkpoint request #{} at step {}", agreed, step);
    return true;
  }

  void save(actor::node_context& ctx, int64_t step) {
    shard_manifest m;
    m.step = step;
    m.world_size = world_;
    m.rank = rank_;
    m.config_hash = config_hash();
    m.data_epoch = epoch_;
    m.data_cursor = cursor_;
    const uint64_t rng = model_->rng_state();
    m.extra["settings"] = settings_record(ctx.spec(), safe_to_change());
    if (evaluated_ && val_ids_.defined()) {  // the held-out loss before step 1, for the closing line, and over how
                                             // many instances (none when they were fewer than the ranks)
      m.extra["eval_before"] = before_;
      m.extra["eval_before_rows"] = val_ids_.size(0);
      if (step == total_ && after_) m.extra["eval_after"] = *after_;  // the closing line's figure
    }
    m.extra["train_batch_size"] = ds_.train_batch_size;  // the global batch, resolved for this world size
    m.rng_state.resize(sizeof rng);
    std::memcpy(m.rng_state.data(), &rng, sizeof rng);
    const std::vector<shard_group> groups = engine_state_groups(*engine_, *model_, rank_, m);
    save_shard(out_dir_, m, groups);
    comm_->barrier();  // every shard is on disk before the commit point
    committed_ = step;
    if (rank_ == 0) {
      commit_checkpoint(out_dir_, step, world_, static_cast<int>(ctx.spec().get_int("keep_checkpoints")));
      ctx.print(fmt::format("[pretrain] checkpoint step {} -> {}", step,
                            (std::filesystem::path(out_dir_) / step_folder_name(step)).string()));
    }
    comm_->barrier();
  }

  // The global batch a checkpoint trained with: its manifest's train_batch_size, or (a manifest from
  // before it was kept) its recorded DeepSpeed JSON's, or that JSON's micro-batch x accumulation x the
  // checkpoint's ranks; 0 when neither says.
  static int64_t recorded_global_batch(const shard_manifest& m0) {
    if (const auto g = m0.extra.find("train_batch_size"); g != m0.extra.end() && g->is_number_integer())
      return g->get<int64_t>();
    const auto s = m0.extra.find("settings");
    if (s == m0.extra.end() || !s->is_object()) return 0;
    const auto c = s->find("deepspeed_config (contents)");
    if (c == s->end() || !c->is_object()) return 0;
    auto int_at = [&](const char* k, int64_t dflt) {
      const auto v = c->find(k);
      return v != c->end() && v->is_number() ? static_cast<int64_t>(v->get<double>()) : dflt;
    };
    if (const int64_t t = int_at("train_batch_size", 0); t > 0) return t;
    const int64_t micro = int_at("train_micro_batch_size_per_gpu", 0);
    return micro > 0 ? micro * int_at("gradient_accumulation_steps", 1) * m0.world_size : 0;
  }

  void restore(actor::node_context& ctx, const std::string& folder) {
    auto ck = load_checkpoint(folder);
    const auto& m0 = ck.manifests.at(0);
    // the settings first: they name what changed (use_lora false -> true), where the hash only says "differs".
    // A checkpoint that records the adapter's config (lora_config) compares that instead of the lora_* settings:
    // beside lora_pretrained the adapter sets r, alpha and the targets and a written lora_dropout replaces its
    // dropout, so the settings as written said neither what the run trained with nor what this one would
    // (a resume that changed the dropout was accepted; one that wrote the adapter's own alpha refused)
    std::set<std::string> safe = safe_to_change();
    const bool lora_recorded = m0.extra.contains("lora_config");
    if (lora_recorded) safe.insert({"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"});
    check_resume_settings(ctx, m0.extra.value("settings", nlohmann::json()), folder, safe,
                          "point output_dir elsewhere or set resume = false");
    if (lora_recorded && model_->has_lora()) {
      const lora_config then = lora_config_from_record(m0.extra.at("lora_config"), folder);
      const lora_config& now = model_->lora();
      std::vector<std::string> changed;
      if (then.lora_r != now.lora_r) changed.push_back(fmt::format("lora_r {} -> {}", then.lora_r, now.lora_r));
      if (then.lora_alpha != now.lora_alpha)
        changed.push_back(fmt::format("lora_alpha {} -> {}", then.lora_alpha, now.lora_alpha));
      if (then.lora_dropout != now.lora_dropout)
        changed.push_back(fmt::format("lora_dropout {} -> {}", then.lora_dropout, now.lora_dropout));
      if (!same_target_modules(then, now))
        changed.push_back(fmt::format("lora_target_modules {} -> {}", fmt::join(then.target_modules, ","),
                                      fmt::join(now.target_modules, ",")));
      if (!changed.empty())
        throw std::runtime_error(fmt::format(
            "node '{}': resuming from {} with the LoRA adapter's config changed: {} (what the run trained with -> "
            "what this run would: the lora_* settings, or beside lora_pretrained its adapter_config.json and a written "
            "lora_dropout); set them back, or point output_dir elsewhere or set resume = false",
            ctx.name(), folder, fmt::join(changed, "; ")));
    }
    if (m0.config_hash != config_hash())
      throw std::runtime_error("checkpoint " + folder +
                               " was made for another model or LoRA setting (config hash differs): point output_dir "
                               "elsewhere or set resume = false");
    if (m0.step > ctx.spec().get_int("total_steps"))
      throw std::invalid_argument(fmt::format(
          "node '{}': {} holds step {}, more than total_steps = {}: a resume only runs longer; set total_steps >= {}, "
          "or point output_dir elsewhere (or set resume = false) to start afresh",
          ctx.name(), folder, m0.step, ctx.spec().get_int("total_steps"), m0.step));
    // the global batch (the settings record leaves the JSON's batch triple out: its split over the ranks
    // may change, as the ranks may): the manifest's, or for an older one its recorded JSON's triple
    const int64_t then = recorded_global_batch(m0);
    if (then > 0 && then != ds_.train_batch_size)
      throw std::invalid_argument(fmt::format(
          "node '{}': {} trained with a global batch of {} rows per update, and this run's is {} "
          "(train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} rank(s)): set train_batch_size "
          "= {} in the DeepSpeed JSON and leave gradient_accumulation_steps out (DeepSpeed then splits it over the "
          "ranks), or make micro-batch x accumulation x ranks {}; or point output_dir elsewhere (or set resume = "
          "false) to start afresh",
          ctx.name(), folder, then, ds_.train_batch_size, ds_.train_micro_batch_size_per_gpu,
          ds_.gradient_accumulation_steps, world_, then, then));
    restore_engine_state(*engine_, ck);
    done_ = committed_ = m0.step;
    // RNG: this rank's stream when the world size is unchanged, else rank 0's
    const auto& mine = m0.world_size == world_ ? ck.manifests.at(rank_) : m0;
    if (mine.rng_state.size() == sizeof(uint64_t)) {
      uint64_t rng;
      std::memcpy(&rng, mine.rng_state.data(), sizeof rng);
      model_->set_rng_state(rng);
    }
    epoch_ = m0.data_epoch;
    cursor_ = m0.data_cursor;
    if (const auto e = m0.extra.find("eval_before"); e != m0.extra.end() && e->is_number()) {
      before_ = e->get<double>();
      before_restored_ = true;
      before_rows_ = m0.extra.value("eval_before_rows", int64_t{0});  // 0: a checkpoint from before the count
      // the finished run's closing figure, for its rerun (a longer run measures its own at its last step)
      if (const auto a = m0.extra.find("eval_after"); a != m0.extra.end() && a->is_number() &&
          m0.step == ctx.spec().get_int("total_steps"))
        after_ = a->get<double>();
    }
    if (rank_ == 0)
      ctx.print(fmt::format("[pretrain] restored step {} ({} ranks, stage {}) on {} ranks, stage {}", m0.step,
                            m0.world_size, m0.zero_stage, world_, zs_.stage));
  }

  void finish_run(actor::node_context& ctx) {
    finished_ = true;
    if (val_ids_.defined() || after_) {  // measured at the last step, or (a rerun of the finished run) restored
      const double l = after_ ? *after_ : engine_->eval_loss(val_ids_, val_targets_);
      if (rank_ == 0)
        ctx.print(fmt::format("[pretrain] held-out loss {:.6f} -> {:.6f} after step {} ({} updates){}", before_, l,
                              done_, engine_->step_count(),
                              val_ids_.defined() ? std::string()
                              : before_rows_ > 0
                                  ? fmt::format(", as the run measured it over {} held-out instances (its last "
                                                "checkpoint)", before_rows_)
                                  : std::string(", as the run measured it (its last checkpoint)")));
    }
    auto mem = engine_->memory();
    ctx.print("[pretrain] memory " + mem.str());
    const auto& s = ctx.spec();
    if (const auto& dir = s.get_string("export_hf"); !dir.empty()) {
      tensor full = engine_->gather_full_params();  // a collective: every rank
      if (rank_ == 0) {
        decoder out(model_->config());
        out.w().flat.copy_from(full);
        if (model_->has_lora()) {  // the adapters (replicated: every rank has them) go in merged
          out.enable_lora(model_->lora(), /*freeze_base=*/false);
          for (const auto& e : model_->adapter_params())
            out.w().by_name.at(e.name).copy_from(model_->w().by_name.at(e.name));
        }
        // save_model's HF path, as the trainers': LoRA merged, and an HF source's tokenizer files and
        // special-token ids beside the weights (a llama2.c source has no tokenizer of its own)
        const std::string src = resolve_user_path(s.get_string("model"), "model").string();
        // a llama2.c source: no tokenizer files, and its stop convention (EOS or a new BOS) as generation_config.json;
        // an HF folder without tokenizer files (flowrun convert --to hf without --tokenizer, an earlier export):
        // its stop ids, no tokenizer (copying one failed after the last step, and every rerun failed there again)
        const bool hf = inspect_model(src).format == model_format::hf;
        const bool src_tok = hf && folder_has_tokenizer(src);
        // a source without a tokenizer of its own (a llama2.c file): the data node's, which the run trained on
        // (its settings record in output_dir), so that transformers' AutoTokenizer loads the folder
        const std::string data_tok = src_tok ? std::string() : run_data_tokenizer(out_dir_);
        if (src_tok)
          save_model(out, dir, model_format::hf, src);
        else
          save_model(out, dir, model_format::hf, data_tok, src);
        ctx.print(std::string("[pretrain] consolidated model") + (model_->has_lora() ? " (LoRA merged)" : "") +
                  " -> " + dir +
                  (!src_tok && !data_tok.empty() ? " (tokenizer: the data node's, " + data_tok + ")"
                   : !src_tok ? " (no tokenizer files: " + src + " has none; give flowrun generate --tokenizer, "
                                "the data node's)"
                              : ""));
      }
    }
    if (const auto& dir = s.get_string("save_lora"); !dir.empty() && model_->has_lora() && rank_ == 0) {
      // PEFT's AutoPeftModelForCausalLM loads the base named in the config: an HF source's folder
      const std::string src = resolve_user_path(s.get_string("model"), "model").string();
      save_adapter(*model_, dir, inspect_model(src).format == model_format::hf ? src : "");
      ctx.print("[pretrain] LoRA adapter (only the LoRA weights) -> " + dir);
    }
    const double dt = std::chrono::duration<double>(clk::now() - t0_).count();
    if (rank_ == 0) ctx.print(fmt::format("[pretrain] done in {:.1f} s", dt));
  }

  int world_ = 1, rank_ = 0;
  std::shared_ptr<comm::store> rendezvous_;
  std::unique_ptr<comm::communicator> comm_;
  comm::abort_registration abortable_;  // comm_ in the abort registry (rank_group::abortable): after comm_
  ds_config ds_;
  zero_settings zs_;
  std::unique_ptr<decoder> model_;
  std::unique_ptr<zero_engine> engine_;
  std::string out_dir_;
  dir_lock out_lock_;  // output_dir's writer lock, held while the node lives
  int64_t total_ = 0, epoch_ = 0, cursor_ = 0, done_ = 0;
  int64_t committed_ = 0;  // the step of the last checkpoint this run committed or resumed from (0: none)
  bool evaluated_ = false;
  bool finished_ = false;  // finish_run ran
  std::optional<double> after_;  // the held-out loss after the last step: measured there, or restored
  bool ids_checked_ = false;  // the first batch's token ids against the model's vocabulary
  double before_ = 0;
  bool before_restored_ = false;  // before_ came from the checkpoint resumed
  bool console_reaches_ = true;   // the console's checkpoint requests reach every rank (one process, all on main)
  std::uint64_t agreed_request_ = 0;  // the latest console request the ranks agreed on (console_asked)
  int64_t before_rows_ = 0;       // the held-out instances before_ was measured over (the checkpoint's; 0: unknown)
  tensor val_ids_, val_targets_;
  clk::time_point t0_;
};

}  // namespace

void register_zero_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  // The global batch crosses cluster nodes when the ranks run on other nodes
  // than the loader (docs/scaling.md): its token tensors go through the bulk plane.
  actor::register_payload_codec(
      "lm_batch", codec_io::bulk_codec<lm_batch_msg>(
                      [](codec_io::writer& w, const lm_batch_msg& m) {
                        w.put(m.step);
                        w.put(m.epoch);
                        w.put(m.cursor);
                        w.put_tensor(m.ids);
                        w.put_tensor(m.targets);
                        w.put_tensor(m.val_ids);
                        w.put_tensor(m.val_targets);
                      },
                      [](codec_io::reader& r) {
                        lm_batch_msg m;
                        m.step = r.get<std::int64_t>();
                        m.epoch = r.get<std::int64_t>();
                        m.cursor = r.get<std::int64_t>();
                        m.ids = r.get_tensor();
                        m.targets = r.get_tensor();
                        m.val_ids = r.get_tensor();
                        m.val_targets = r.get_tensor();
                        return m;
                      }));
  using T = graph::setting_type;
  auto shared = [](graph::node_kind& k) {
    k.option("seq_length", T::int_, std::int64_t{64}, "tokens per instance (TencentPretrain --seq_length)").at_least(1)
        .option("total_steps", T::int_, std::int64_t{20}, "optimizer steps (TencentPretrain --total_steps)").at_least(1)
        .option("output_dir", T::output, std::string(""), "checkpoint folder (empty: no checkpoints)")
        .option("resume", T::bool_, true, "continue from output_dir's latest committed checkpoint when there is one")
        .option("seed", T::int_, std::int64_t{1234}, "data order and LoRA init");
    // the run's --metrics file is appended to when the node resumes (run_graph)
    k.resumes = [](const graph::node_spec& n) {
      try {
        return n.get_bool("resume") && !resume_folder(n.get_string("output_dir")).empty();
      } catch (const std::exception&) {  // a damaged `latest`: the node's start names it
        return false;
      }
    };
  };
  {
    graph::node_kind k{"lm_batches", "LM data: documents tokenized, concatenated, cut to seq_length; one global batch per step"};
    k.require("data", T::path, "UTF-8 text, documents separated by blank lines (or one a line: document_per_line)")
        .option("document_per_line", T::bool_, false,
                "one document a line, as TencentPretrain's lm data processor reads its corpus (false: documents "
                "separated by blank lines, TinyStories')")
        .require("tokenizer", T::path, "SentencePiece .model (or a GPT-2 BPE folder)")
        .option("train_batch_size", T::int_, std::int64_t{8}, "rows per optimizer step, all ranks together (DeepSpeed)").at_least(1)
        .option("eval_rows", T::int_, std::int64_t{64},
                "held-out instances for the loss before and after (0: none; from 8 up rounded down to a multiple "
                "of 8; a run needs one per rank)")
        .at_least(0)
        .output("batch", "lm_batch", "one global batch per step", true);
    shared(k);
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new lm_batches); });
  }
  {
    graph::node_kind k{"zero_rank", "a ZeRO shard owner: one replica per rank, trains its rows of each global batch"};
    k.blocking = true;
    k.require("model", T::path, "initial weights: llama2.c .bin, HF folder or flowrun folder")
        .require("deepspeed_config", T::path, "DeepSpeed JSON (batch sizes, zero_optimization.stage, optimizer, scheduler)")
        .option("zero_stage", T::int_, std::int64_t{-1}, "override zero_optimization.stage (-1: the config's)").in_range(-1, 3)
        .option("save_checkpoint_steps", T::int_, std::int64_t{10},
                "checkpoint every N steps and at the last step; 0: only when the console asks (no final checkpoint: "
                "a rerun trains afresh, and generate --zero_checkpoint has none to read; export_hf still writes the "
                "model)")
        .at_least(0)
        .option("keep_checkpoints", T::int_, std::int64_t{2}, "committed step folders kept").at_least(1)
        .option("export_hf", T::output, std::string(""), "at the end, write the consolidated model here (HF format)")
        .option("use_lora", T::bool_, false, "train LoRA adapters only (TencentPretrain --use_lora)")
        .option("lora_r", T::int_, std::int64_t{8}, "LoRA rank (at most the model's dim)").at_least(1)
        .option("lora_alpha", T::float_, 16.0, "LoRA alpha").above(0)
        .option("lora_dropout", T::float_, 0.0, "LoRA dropout (beside lora_pretrained: replaces the adapter's)").in_range(0, 1, false, /*high_open=*/true)
        .option("lora_target_modules", T::string, std::string("q_proj,v_proj"),
                "PEFT target_modules, comma-separated (q_proj,v_proj: PEFT's default for LLaMA; all-linear: every Linear)")
        .option("lora_pretrained", T::path, std::string(""), "continue from this LoRA adapter folder (base + LoRA; its adapter_config.json sets lora_r, lora_alpha and lora_target_modules)")
        .option("save_lora", T::output, std::string(""), "at the end, save only the LoRA weights here (PEFT format)")
        .option("memory_limit_gb", T::float_, 0.0, "refuse a plan over this many GB per process (0: available memory)").at_least(0)
        .option("gradient_checkpointing", T::bool_, false,
                "keep only each layer's input; recompute the layer in backward (less activation memory, one more "
                "forward per layer)")
        .option("print_every", T::int_, std::int64_t{5}, "print the loss every N steps").at_least(1)
        .input("batch", "lm_batch", "global batches");
    actor::add_tensorboard_settings(k);
    shared(k);
    add_rank_group_settings(k);
    // TencentPretrain's flags (tencentpretrain/opts.py) that are DeepSpeed JSON keys or other settings here
    k.known_as("learning_rate",
               "TencentPretrain's --learning_rate is the DeepSpeed JSON's optimizer.params.lr here (and the "
               "scheduler's warmup_max_lr), in the file deepspeed_config names")
        .known_as("accumulation_steps",
                  "TencentPretrain's --accumulation_steps is the DeepSpeed JSON's gradient_accumulation_steps here")
        .known_as("warmup", "TencentPretrain's --warmup (a fraction of total_steps) is the DeepSpeed JSON's "
                            "scheduler.params.warmup_num_steps here (a number of steps)")
        .known_as("report_steps", "TencentPretrain's --report_steps is print_every here")
        .known_as("batch_size", "TencentPretrain's --batch_size is the DeepSpeed JSON's "
                                "train_micro_batch_size_per_gpu here (the data node's train_batch_size is the global "
                                "batch)")
        .known_as("world_size", "TencentPretrain's --world_size is replicas here (x the processes of flowrun launch)")
        .known_as("pretrained_model_path", "TencentPretrain's --pretrained_model_path is model here (a llama2.c "
                                           ".bin, a flowrun folder or a Hugging Face folder)")
        .known_as("output_model_path", "TencentPretrain's --output_model_path is output_dir here (the ZeRO "
                                       "checkpoints; export_hf writes the consolidated model, save_lora the adapter)")
        .known_as("lora_pretrained_model_path",
                  "TencentPretrain's --lora_pretrained_model_path is lora_pretrained here (a PEFT adapter folder)");
    // The run's length and the rows' width are settings of both nodes (as TencentPretrain's
    // --total_steps and --seq_length are one flag each): the data node's total_steps ends the
    // stream, the ranks' sets the schedule, the ETA and the end-of-run export; seq_length is the
    // data's width and the ranks' memory plan. They must agree.
    k.check = [](const graph::node_spec& n, const graph::graph_spec& g) {
      std::vector<graph::node_kind::problem> problems;
      // the DeepSpeed JSON for this run's ranks (replicas x launched processes): a JSON that does not load
      // (a key DeepSpeed refuses, a batch triple that contradicts itself) is refused now, once, rather than
      // by every rank's start()
      const int world = static_cast<int>(n.replicas) * process_count();
      const std::optional<ds_config> ds = check_ds_config(n, world, problems);
      for (const auto& e : g.edges) {
        const auto* src = e.to_node == n.name ? g.find_node(e.from_node) : nullptr;
        if (!src || src->kind != "lm_batches") continue;
        // the data's tokens must be the model's: a tokenizer larger than the embedding failed mid-run, and
        // another one of the same size (GPT-2 BPE ids into a model with tok512) trained without a word
        if (const std::string why = tokenizer_model_mismatch(src->get_string("tokenizer"), n.get_string("model"));
            !why.empty())
          problems.push_back({"model",
                              fmt::format("node '{}' trains on the tokens of its data node '{}', which reads them with {}",
                                          n.name, src->name, why),
                              fmt::format("give node '{}' the model's own tokenizer (for a Hugging Face folder: "
                                          "--set node.{}.tokenizer=FOLDER)",
                                          src->name, src->name)});
        // one checkpoint holds both: resume on one node alone trained nothing and saved nothing with exit 0 (the
        // data resuming at the end beside ranks starting afresh), or fed a resumed run its first batches again
        if (src->get_bool("resume") != n.get_bool("resume"))
          problems.push_back({"resume",
                              fmt::format("node '{}': resume = {} but its data node '{}' has resume = {}: the data "
                                          "position is committed with the ranks' checkpoint, so the two resume "
                                          "together or not at all",
                                          n.name, n.get_bool("resume"), src->name, src->get_bool("resume")),
                              fmt::format("set resume on both nodes (--set node.{}.resume=false --set "
                                          "node.{}.resume=false to start afresh)",
                                          src->name, n.name)});
        for (const char* key : {"total_steps", "seq_length"})
          if (src->get_int(key) != n.get_int(key))
            problems.push_back({key,
                                fmt::format("node '{}': {} = {} but its data node '{}' has {} = {}: the two must "
                                            "be equal",
                                            n.name, key, n.get_int(key), src->name, key, src->get_int(key)),
                                fmt::format("set {} to one value on both nodes", key)});
        // the data position is committed with the ranks' checkpoints: a data node resuming from its folder
        // beside ranks starting afresh in another trained nothing, saved nothing and ended with exit 0
        // one folder however spelt ("dir" and "dir/", a symbolic link to it)
        if (!same_path(src->get_string("output_dir"), n.get_string("output_dir")))
          problems.push_back({"output_dir",
                              fmt::format("node '{}': output_dir = \"{}\" but its data node '{}' has output_dir = "
                                          "\"{}\": the data position is saved with the checkpoints, so the two must "
                                          "be one folder",
                                          n.name, n.get_string("output_dir"), src->name, src->get_string("output_dir")),
                              fmt::format("set output_dir to one folder on both nodes (--set node.{}.output_dir=DIR "
                                          "--set node.{}.output_dir=DIR)",
                                          src->name, n.name)});
        // the global batch the data node cuts must be the DeepSpeed JSON's (it failed at the first batch, in
        // the engine, naming neither)
        if (ds) {
          const ds_config& c = *ds;
          std::string typos;  // a misspelt batch key is why the triple resolved to another size
          for (const auto& t : c.likely_typos) typos += "; " + t.str();
          if (src->get_int("train_batch_size") != c.train_batch_size)
            problems.push_back(
                {"deepspeed_config",
                 fmt::format("node '{}': {} resolves train_batch_size to {} (train_micro_batch_size_per_gpu {} x "
                             "gradient_accumulation_steps {} x {} rank(s)), but its data node '{}' cuts batches of "
                             "train_batch_size = {}{}",
                             n.name, c.where, c.train_batch_size, c.train_micro_batch_size_per_gpu,
                             c.gradient_accumulation_steps, world, src->name, src->get_int("train_batch_size"), typos),
                 fmt::format("make them equal: set node.{}.train_batch_size = {}, or the JSON's train_batch_size "
                             "to {}",
                             src->name, c.train_batch_size, src->get_int("train_batch_size"))});
        }
      }
      // the end-of-run outputs outside output_dir: a run given another output_dir (and so its own checkpoints)
      // still writes them where the graph says, over the first run's (said, not refused: one place for every
      // run's export may be wanted)
      if (const auto& od = n.get_string("output_dir"); !od.empty())
        for (const char* key : {"export_hf", "save_lora"})
          if (const auto& to = n.get_string(key); !to.empty()) {
            const auto rel = std::filesystem::path(to).lexically_normal().lexically_relative(
                std::filesystem::path(od).lexically_normal());
            if (rel.empty() || *rel.begin() == "..")
              spdlog::warn("node '{}': {} = \"{}\" is outside output_dir = \"{}\": another run with another "
                           "output_dir writes it there too, over this one's; set {} beside output_dir to keep each "
                           "run's",
                           n.name, key, to, od, key);
          }
      // LoRA settings without use_lora change nothing (the whole model trains, no adapter is read or written)
      if (!n.get_bool("use_lora"))
        for (const char* key : {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_pretrained",
                                "save_lora"})
          if (const auto* w = n.find_setting(key);
              w && !w->from_default && !(std::holds_alternative<std::string>(w->value) && n.get_string(key).empty()))
            problems.push_back({key,
                                fmt::format("node '{}': {} is set but use_lora = false: the whole model trains and no "
                                            "adapter is read or written",
                                            n.name, key),
                                fmt::format("set use_lora = true, or remove {}", key)});
      if (const auto* w = n.find_setting("lora_target_modules"); w && !w->from_default) {
        std::string t = n.get_string("lora_target_modules");
        t.erase(std::remove_if(t.begin(), t.end(), [](unsigned char ch) { return std::isspace(ch) || ch == ','; }),
                t.end());
        if (t.empty())
          problems.push_back({"lora_target_modules",
                              fmt::format("node '{}': lora_target_modules is empty (PEFT would take its default, "
                                          "q_proj,v_proj for LLaMA; this used to mean all-linear)",
                                          n.name),
                              "name the modules: q_proj,v_proj (the default), all-linear, or others"});
      }
      return problems;
    };
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new zero_rank); });
  }
}

}  // namespace flowrun::actors
