// Trains a GPT-2-style decoder (gpt_model.hpp) with N thread ranks on the host backend: one FSDP unit per block,
// the root unit (embeddings, final norm, tied head) kept gathered, AdamW with warm-up and cosine schedule and
// global-norm clipping, bf16 compute with fp32 master weights (--precision fp8 or int8: gathered as fp8 E4M3 or
// int8 in blocks of 16 with a scale each, precision::scaled, computed in bf16; int8-qgz: gradients reduced in int8
// blocks of 16 too, through all_to_all). Prints per step the loss, learning
// rate, gradient norm and tokens/s, and at the end every rank's peak memory by category next to the planner's
// prediction and the activations the trainer kept.
//   bazel run //examples/04_gpt_host -- --ranks 4 [--tp T] [--steps 50] [--precision bf16|fp32|fp8|int8|int8-qgz]
//       [--strategy full_shard|shard_grad_op|no_shard|hybrid_shard]
//       [--lose-rank R --at-step S [--fail-at forward|backward|reduction|optimizer] [--rejoin-at T]]
//       [--checkpoint-activations]
//       [--layers L] [--width C] [--heads H] [--context T] [--vocab V] [--batch B] [--lr X] [--warmup W]
//       [--export-init FILE.safetensors] [--losses FILE] [--pack] [--experts N --top-k K --ep E]
// --export-init writes the initial weights (fp32 safetensors, GPT-2 names) before the first step; --losses writes
// one line per step (step, loss, learning rate, gradient norm): the PyTorch peer (bench/peer) reads both.
// --pack trains on documents of varied lengths packed into rows of the context (fsdp::data: attention inside each
// document, every rank the same real tokens); --batch is then the rows of a step.
// --tp T splits each block over tensor groups of T consecutive ranks, Megatron-style (model_options::tensor_parallel:
// each rank T's share of the heads and of the MLP, the projections' partial products summed over the group); the
// strategy shards each rank's slices over the ranks / T data-parallel ranks, which split the batch.
// --strategy hybrid_shard is HSDP over shard groups of 2 ranks (replicas across them).
// --experts N replaces each block's MLP with N experts of its shape and a router choosing --top-k K of them a token
// (default 2; dropless, with a load-balancing loss: gpt::shape), each block's experts a unit of their own;
// --ep E splits them over expert groups of E ranks (model_options::expert_parallel), each rank holding N / E of
// them, the tokens sent to their experts and back by all_to_all_v on the model's expert group.
// --lose-rank R --at-step S (with --strategy hybrid_shard) trains S steps, then rank R fails (its thread returns);
// the survivors' quorum names it, they shrink the world, agree on the step they hold whole (fsdp::elastic::agree),
// the replica group R was in leaves, and the others take the state in memory (fsdp::elastic::reshard, no
// checkpoint) and train on to the last step at one replica group fewer, with the same global batch: the loss curve
// goes on. --fail-at PHASE: rank R fails during step S instead: its thread throws before that step's forward,
// backward or optimizer step, or (reduction) it dies inside its last replica all-reduce of the step (a fault
// injected into the collective, comm::local_options::fault); every survivor's step fails before any update (the
// step's commit: here the clipping norm's all-reduce), and they continue from step S. Each step prints as usual, and
// the survivors say what they did; --losses has every step's line, whichever rank printed it. --rejoin-at T: before
// step T the survivors grow their group by the ranks that left; replacements (new threads, holding nothing) receive
// their shards and the step count from the survivors (fsdp::elastic::join, no checkpoint) and every rank trains on
// at the full grid.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <fsdp/checkpoint/safetensors.hpp>
#include <fsdp/elastic/reshard.hpp>

#include "examples/04_gpt_host/gpt_host.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: gpt_host [--ranks N] [--tp T] [--lose-rank R --at-step S [--fail-at "
               "forward|backward|reduction|optimizer] [--rejoin-at T]] [--steps S] [--precision "
               "bf16|fp32|fp8|int8|int8-qgz] "
               "[--strategy full_shard|shard_grad_op|no_shard|hybrid_shard] [--checkpoint-activations] [--layers L] "
               "[--width C] "
               "[--heads H] [--context T] [--vocab V] [--batch B] [--lr X] [--warmup W] [--seed S] "
               "[--export-init FILE] [--losses FILE] [--pack] [--experts N --top-k K --ep E]\n",
               why.c_str());
  std::exit(2);
}

int to_int(const char* s, const std::string& flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || v <= 0 || v > 1 << 20) usage(flag + " needs a positive integer, got '" + s + "'");
  return static_cast<int>(v);
}

/// A path given to `bazel run` is the caller's: relative paths are made absolute against its directory.
std::string caller_path(std::string p) {
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY"); wd && !p.empty() && p[0] != '/')
    p = std::string(wd) + "/" + p;
  return p;
}

struct outputs {
  std::string export_init, losses;
};

/// Writes one line per step (step, loss, learning rate, gradient norm): what the PyTorch peer reads.
int write_losses(const std::string& path, const std::vector<float>& losses, const std::vector<float>& lrs,
                 const std::vector<double>& norms) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "error: cannot write the losses to %s\n", path.c_str());
    return 1;
  }
  for (std::size_t i = 0; i < losses.size(); ++i)
    std::fprintf(f, "%zu %.9g %.9g %.9g\n", i, losses[i], lrs[i], norms[i]);
  std::fclose(f);
  std::printf("losses written to %s\n", path.c_str());
  return 0;
}

template <class Strategy, class Precision>
int run(int ranks, const gpt::config& cfg, const outputs& out) {
  using Policy = fsdp::policy<Strategy, fsdp::prefetch::next, Precision>;
  const auto pf = fsdp::facts_of_precision<Precision>();
  const auto& s = cfg.model;
  const gpt::entropies h = gpt::data_entropies(cfg.data, s.vocab);
  const int tp = cfg.options.tensor_parallel;
  std::string groups = tp > 1 ? " in tensor groups of " + std::to_string(tp) : "";
  if (s.experts > 0)
    groups += ", " + std::to_string(s.experts) + " experts a block (" + std::to_string(s.top_k) + " a token) in " +
              (cfg.options.expert_parallel > 1 ? "expert groups of " + std::to_string(cfg.options.expert_parallel)
                                               : std::string("every rank"));
  std::printf(
      "GPT: %d layers, width %d, %d heads, context %d, vocabulary %d: %lld parameters; %s, %d thread ranks%s, "
      "%s compute, %s reduction, global batch %d %s (%d positions)%s\n",
      s.layers, s.width, s.heads, s.context, s.vocab, static_cast<long long>(gpt::parameters(s)),
      std::string(Strategy::name).c_str(), ranks, groups.c_str(), std::string(fsdp::name_of(pf.compute)).c_str(),
      std::string(fsdp::name_of(pf.reduce)).c_str(), cfg.global_batch,
      cfg.packing.on ? "packed rows of documents" : "sequences", cfg.global_batch * s.context,
      cfg.checkpoint_activations ? ", activation checkpointing" : "");
  std::printf("data: entropy of the token frequencies %.4f nats, lowest reachable loss %.4f nats\n", h.frequencies,
              h.floor);
  std::vector<gpt::result> results(static_cast<std::size_t>(ranks));
  fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& comm) {
    auto before = [&](auto& model) {
      if (!out.export_init.empty()) fsdp::safetensors::save(model, out.export_init, {.overwrite = true});
    };
    results[static_cast<std::size_t>(comm.rank())] = gpt::train<Policy>(comm, cfg, before);
  });
  const auto& r0 = results[0];
  double tokens = 0;
  for (std::int64_t t : r0.step_tokens) tokens += static_cast<double>(t);
  std::printf("trained %d steps in %.3f s (%.0f tokens/s): loss %.6f -> %.6f\n", cfg.steps, r0.seconds,
              tokens / r0.seconds, r0.losses.front(), r0.losses.back());
  if (cfg.packing.on)
    std::printf("packing: %.2f%% of the positions were real tokens; the data resumes at document %llu\n",
                100.0 * tokens / (static_cast<double>(cfg.steps) * cfg.global_batch * s.context),
                static_cast<unsigned long long>(r0.data_state.next_document));
  std::vector<fsdp::rank_memory> table;
  for (std::size_t r = 0; r < results.size(); ++r)
    table.push_back({int(r), results[r].memory.peak, results[r].planned});
  std::printf("\n%s", fsdp::memory_table(table).c_str());
  std::printf("activations held by the trainer at the end of forward: %.2f KiB per rank (%.2f KiB per block%s)\n",
              r0.activation_bytes / 1024.0, r0.activation_bytes_per_block / 1024.0,
              cfg.checkpoint_activations ? ": its input only, the rest recomputed in backward" : "");
  if (!out.export_init.empty()) std::printf("initial weights written to %s\n", out.export_init.c_str());
  if (!out.losses.empty()) return write_losses(out.losses, r0.losses, r0.lrs, r0.norms);
  return 0;
}

/// --lose-rank R --at-step S [--fail-at PHASE] [--rejoin-at T].
struct losing {
  int lost = -1, at = 0, rejoin = 0;
  /// Empty: rank `lost` fails between steps, before step `at` (its thread returns; the survivors' quorum names it).
  /// "forward", "backward", "optimizer": its thread throws before that phase of step `at`; "reduction": it dies
  /// inside its last replica all-reduce of step `at` (a fault in the collective: comm::local_options::fault).
  std::string phase;
};

/// What a rank that fails on purpose throws (a real trainer's failing rank throws).
struct rank_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Each step's loss, learning rate and norm, from whichever rank prints it (new rank 0 of each grid).
struct step_record {
  std::mutex mu;
  std::vector<float> losses, lrs;
  std::vector<double> norms;
  explicit step_record(int steps)
      : losses(static_cast<std::size_t>(steps)),
        lrs(static_cast<std::size_t>(steps)),
        norms(static_cast<std::size_t>(steps)) {}
  void keep(const gpt::result& r, int first) {
    std::lock_guard lk(mu);
    for (std::size_t i = 0; i < r.losses.size(); ++i) {
      const std::size_t s = static_cast<std::size_t>(first) + i;
      losses.at(s) = r.losses[i], lrs.at(s) = r.lrs[i], norms.at(s) = r.norms[i];
    }
  }
};

/// --lose-rank: HSDP over shard groups of 2; rank `l.lost` fails between steps or during step `l.at` (losing); the
/// survivors shrink the world, agree on the step they hold whole (fsdp::elastic::agree), and the replica groups
/// without the failed rank continue from that step with the state in memory. --rejoin-at (`l.rejoin` > 0): before
/// step `l.rejoin`, replacements for the ranks that left join and take their shards from the survivors.
template <class Precision>
int run_losing(int ranks, const gpt::config& cfg, const losing& l, const outputs& out) {
  using Policy = fsdp::policy<fsdp::sharding::hybrid_shard<2>, fsdp::prefetch::next, Precision>;
  const int replicas = ranks / 2, lost = l.lost, at = l.at, rejoin = l.rejoin;
  if (ranks % 2 != 0 || replicas < 2)
    usage(
        "--lose-rank trains hybrid_shard over shard groups of 2 ranks and needs 2 of them at least: --ranks 4, 6, "
        "...");
  if (lost < 0 || lost >= ranks)
    usage("--lose-rank " + std::to_string(lost) + " is not a rank of " + std::to_string(ranks));
  if (at < 1 || at >= cfg.steps) usage("--at-step must be in [1, --steps)");
  if (rejoin > 0 && (rejoin <= at || rejoin >= cfg.steps)) usage("--rejoin-at must be in (--at-step, --steps)");
  if (cfg.options.tensor_parallel != 1 || cfg.packing.on) usage("--lose-rank takes neither --tp nor --pack");
  std::printf("GPT: hybrid_shard, %d replica groups of 2 thread ranks, %s compute; rank %d fails %s%s\n", replicas,
              std::string(fsdp::name_of(fsdp::facts_of_precision<Precision>().compute)).c_str(), lost,
              l.phase.empty()
                  ? ("after step " + std::to_string(at - 1)).c_str()
                  : ("in step " + std::to_string(at) + ", " +
                     (l.phase == "reduction" ? "inside its last replica all-reduce" : "before its " + l.phase))
                        .c_str(),
              rejoin > 0 ? (", replacements join before step " + std::to_string(rejoin)).c_str() : "");
  std::mutex mu;
  std::vector<std::string> said(static_cast<std::size_t>(ranks)), arrived(static_cast<std::size_t>(ranks));
  step_record record(cfg.steps);
  int first_survivor = lost == 0 ? 1 : 0;  // prints the steps before the failure (rank 0, unless it fails)
  fsdp::comm::local_options lo;
  if (l.phase == "reduction") {  // its (at + 1)-th step's last replica all-reduce: one a unit (the blocks and root)
    const int units = cfg.model.layers + 1;
    lo.fault = [lost, units, at, seen = std::make_shared<std::atomic<int>>(0)](const fsdp::comm::collective_site& s) {
      if (s.world_rank == lost && s.kind == fsdp::collective::all_reduce && !s.group.empty() && s.count > 1 &&
          ++*seen == (at + 1) * units)
        throw rank_failure("rank " + std::to_string(lost) + " died inside its replica all-reduce #" +
                           std::to_string(s.seq));
    };
  }
  std::string failed_rank;
  try {
    fsdp::comm::run_local(
        ranks,
        [&](fsdp::comm::local_communicator& comm) {
          const int me = comm.rank();
          auto model = gpt::make_model<Policy>(comm, cfg);
          auto opt = gpt::make_optimizer(model, cfg);
          auto tr = gpt::make_host_trainer{}(model, cfg.model, gpt::batch_per_rank(cfg, model.mesh()));
          gpt::config mine = cfg;
          mine.before = [&, me](int step, const char* phase) {
            if (me == lost && step == at && l.phase == phase)
              throw rank_failure("rank " + std::to_string(me) + " failed before step " + std::to_string(at) + "'s " +
                                 phase);
          };
          gpt::result before;
          std::string failure;
          try {
            gpt::run_steps(model, opt, tr, mine, 0, l.phase.empty() ? at : cfg.steps, before);
            if (l.phase.empty()) {
              if (me == lost) return;  // fails: issues nothing more
              comm.barrier();          // the quorum between steps
            }
          } catch (const fsdp::comm_error& e) {
            if (me == lost) throw rank_failure(e.what());  // its own stream failed under it
            failure = e.what();
            comm.abort("rank " + std::to_string(me) + " saw a failure");  // the others stop waiting at once
          }
          if (me == first_survivor) record.keep(before, 0);
          std::vector<int> survivors, joins;
          fsdp::comm::local_communicator group = comm.shrink(&survivors);
          fsdp::backend::host staging(me);  // the model's streams may have failed with the step
          const fsdp::plan::committed_state c = fsdp::elastic::agree(model, survivors, group, staging);
          for (int q : survivors)
            if (q / 2 != lost / 2) joins.push_back(q);  // the replica groups without a loss
          const auto q = fsdp::elastic::committed_request(model, c, {replicas - 1, 2}, joins);
          const auto place = fsdp::elastic::transfer_place(c, joins, me);
          fsdp::comm::local_communicator xfer = group.split(place.first, place.second);
          const auto joined = std::find(joins.begin(), joins.end(), me);
          const int mine_new = joined == joins.end() ? -1 : static_cast<int>(joined - joins.begin());
          fsdp::comm::local_communicator fresh = group.split(mine_new < 0 ? 1 : 0, mine_new);
          const bool holds = std::find(c.holders.begin(), c.holders.end(), me) != c.holders.end();
          {  // said before the transfer, a collective of the survivors: new rank 0 prints every line after it
            std::lock_guard lk(mu);
            said[static_cast<std::size_t>(me)] = "saw: " + failure +
                                                 (mine_new < 0 ? std::string("; leaves with its replica group")
                                                               : "; continues as rank " + std::to_string(mine_new) +
                                                                     " of " + std::to_string(joins.size()));
          }
          const int step = static_cast<int>(c.step);
          if (mine_new < 0) {  // the lost rank's replica partner: sends what the others need (here: nothing), leaves
            if (holds)
              fsdp::elastic::reshard(q, model, opt, static_cast<decltype(&model)>(nullptr),
                                     static_cast<decltype(&opt)>(nullptr), xfer, &staging);
            return;
          }
          auto next = gpt::make_model<Policy>(fresh, cfg);
          auto next_opt = gpt::make_optimizer(next, cfg);
          const fsdp::plan::reshard_plan p = holds ? fsdp::elastic::reshard(q, model, opt, &next, &next_opt, xfer)
                                                   : fsdp::elastic::join(q, next, next_opt, xfer);
          if (mine_new == 0) {
            std::lock_guard lk(mu);
            for (std::size_t k = 0; k < said.size(); ++k)
              if (!said[k].empty()) std::printf("rank %zu %s\n", k, said[k].c_str());
            std::string holders;
            for (int h : c.holders) holders += (holders.empty() ? "" : ", ") + std::to_string(h);
            std::printf("the survivors hold step %d whole (ranks %s): training goes on from it\n", step,
                        holders.c_str());
            std::printf("%s", fsdp::plan::describe(p, q, 1 + static_cast<int>(opt.state_names().size())).c_str());
            std::fflush(stdout);
          }
          auto next_tr = gpt::make_host_trainer{}(next, cfg.model, gpt::batch_per_rank(cfg, next.mesh()));
          gpt::result middle;
          gpt::run_steps(next, next_opt, next_tr, cfg, step, (rejoin > 0 ? rejoin : cfg.steps) - step, middle);
          if (mine_new == 0) record.keep(middle, step);
          if (rejoin <= 0) return;
          // The return: fresh's ranks grow their group by the ranks that left; the replacements (new threads,
          // holding nothing) take the last ranks of the grown grid and receive their shards from the survivors
          // (fsdp::elastic::join, no checkpoint read).
          const int stayed = fresh.size(), newcomers = ranks - stayed;
          std::vector<int> kept, back;
          for (int k = 0; k < stayed; ++k) kept.push_back(k), back.push_back(k);
          back.insert(back.end(), static_cast<std::size_t>(newcomers), fsdp::plan::newcomer);
          const fsdp::plan::shard_grid grid_before{replicas - 1, 2};
          // Every rank of the grown grid, survivor (`from`: its model and optimizer) or newcomer (null): the model
          // at the full grid, its state from the survivors, then the steps left.
          const auto grown_rank = [&](fsdp::comm::local_communicator& grown, auto* from, auto* from_opt) {
            fsdp::comm::local_communicator moves = grown.split(0, grown.rank());
            auto full = gpt::make_model<Policy>(grown, cfg);
            auto full_opt = gpt::make_optimizer(full, cfg);
            fsdp::plan::reshard_plan moved;
            fsdp::plan::reshard_request asked;
            if (from) {
              asked = fsdp::elastic::reshard_request_of(*from, {replicas, 2}, kept, back);
              moved = fsdp::elastic::reshard(asked, *from, *from_opt, &full, &full_opt, moves);
            } else {
              asked = fsdp::elastic::join_request_of(full, grid_before, kept, back);
              moved = fsdp::elastic::join(asked, full, full_opt, moves);
              std::lock_guard lk(mu);
              arrived[static_cast<std::size_t>(grown.rank())] =
                  "joined: received its shards from the survivors, and step count " + std::to_string(full.step_count());
            }
            moves.barrier();  // every newcomer has said what it did
            if (grown.rank() == 0) {
              std::lock_guard lk(mu);
              std::printf("ranks 0-%d invited %d replacement(s) as ranks %d-%d of %d x 2 before step %d\n", stayed - 1,
                          newcomers, stayed, ranks - 1, replicas, rejoin);
              for (int k = stayed; k < ranks; ++k)
                std::printf("rank %d %s\n", k, arrived[static_cast<std::size_t>(k)].c_str());
              std::printf(
                  "%s",
                  fsdp::plan::describe(moved, asked, 1 + static_cast<int>(full_opt.state_names().size())).c_str());
              std::fflush(stdout);
            }
            auto full_tr = gpt::make_host_trainer{}(full, cfg.model, gpt::batch_per_rank(cfg, full.mesh()));
            gpt::result rest;
            gpt::run_steps(full, full_opt, full_tr, cfg, rejoin, cfg.steps - rejoin, rest);
            if (grown.rank() == 0) record.keep(rest, rejoin);
          };
          fsdp::comm::local_invitation invitation;
          fsdp::comm::local_communicator grown = fresh.grow(newcomers, &invitation);
          std::future<void> replacements;
          if (mine_new == 0)  // rank 0 starts the replacements' threads and hands them the invitation
            replacements = fsdp::comm::start_joining(invitation, [&](fsdp::comm::local_communicator& g) {
              grown_rank(g, static_cast<decltype(&next)>(nullptr), static_cast<decltype(&next_opt)>(nullptr));
            });
          grown_rank(grown, &next, &next_opt);
          if (mine_new == 0) replacements.get();
        },
        lo);
  } catch (const rank_failure& e) {  // the failed rank's own error, which run_local rethrows once all ended
    failed_rank = e.what();
  }
  if (!failed_rank.empty()) std::printf("rank %d's thread ended with: %s\n", lost, failed_rank.c_str());
  std::printf("trained to step %d: loss %.6f -> %.6f\n", cfg.steps, record.losses.front(), record.losses.back());
  return out.losses.empty() ? 0 : write_losses(out.losses, record.losses, record.lrs, record.norms);
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4;
  std::string strategy = "full_shard", precision = "bf16";
  outputs out;
  losing lose;
  gpt::config cfg;
  cfg.global_batch = 16;
  cfg.verbose = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--ranks") ranks = to_int(value(), a);
    else if (a == "--tp")
      cfg.options.tensor_parallel = to_int(value(), a);
    else if (a == "--steps") cfg.steps = to_int(value(), a);
    else if (a == "--experts")
      cfg.model.experts = to_int(value(), a);
    else if (a == "--top-k")
      cfg.model.top_k = to_int(value(), a);
    else if (a == "--ep")
      cfg.options.expert_parallel = to_int(value(), a);
    else if (a == "--lose-rank") {
      const char* v = value();
      lose.lost = std::string(v) == "0" ? 0 : to_int(v, a);
    } else if (a == "--at-step")
      lose.at = to_int(value(), a);
    else if (a == "--rejoin-at")
      lose.rejoin = to_int(value(), a);
    else if (a == "--fail-at") {
      lose.phase = value();
      if (lose.phase != "forward" && lose.phase != "backward" && lose.phase != "reduction" && lose.phase != "optimizer")
        usage("--fail-at takes forward, backward, reduction or optimizer, got '" + lose.phase + "'");
    } else if (a == "--batch")
      cfg.global_batch = to_int(value(), a);
    else if (a == "--layers") cfg.model.layers = to_int(value(), a);
    else if (a == "--width") cfg.model.width = to_int(value(), a);
    else if (a == "--heads") cfg.model.heads = to_int(value(), a);
    else if (a == "--context") cfg.model.context = to_int(value(), a);
    else if (a == "--vocab") cfg.model.vocab = to_int(value(), a);
    else if (a == "--warmup") cfg.opt.warmup = to_int(value(), a);
    else if (a == "--seed") cfg.seed = static_cast<std::uint64_t>(to_int(value(), a));
    else if (a == "--lr") {
      const char* v = value();
      char* end = nullptr;
      cfg.opt.lr = std::strtof(v, &end);
      if (!end || *end || !(cfg.opt.lr > 0) || !std::isfinite(cfg.opt.lr))
        usage(std::string("--lr needs a positive number, got '") + v + "'");
    } else if (a == "--strategy") strategy = value();
    else if (a == "--precision") precision = value();
    else if (a == "--checkpoint-activations") cfg.checkpoint_activations = true;
    else if (a == "--pack") cfg.packing.on = true;
    else if (a == "--export-init") out.export_init = caller_path(value());
    else if (a == "--losses") out.losses = caller_path(value());
    else usage("unknown argument " + a);
  }
  cfg.opt.total = cfg.steps;  // the cosine spans the run
  try {
    gpt::validate(cfg.model, cfg.options.tensor_parallel);
    if (lose.rejoin > 0 && lose.lost < 0) usage("--rejoin-at needs --lose-rank and --at-step");
    if (!lose.phase.empty() && lose.lost < 0) usage("--fail-at needs --lose-rank and --at-step");
    if (lose.lost >= 0 || lose.at > 0) {
      if (lose.lost < 0 || lose.at <= 0) usage("--lose-rank and --at-step go together");
      if (strategy != "hybrid_shard") usage("--lose-rank needs --strategy hybrid_shard (a replica group survives)");
      return fsdp::select(
          "--precision", precision,
          [&](auto p) { return run_losing<typename decltype(p)::type>(ranks, cfg, lose, out); },
          fsdp::named<fsdp::precision::mixed<fsdp::bfloat16>>{"bf16"}, fsdp::named<fsdp::precision::full>{"fp32"});
    }
    return gpt::with_policy_flags<fsdp::sharding::hybrid_shard<2>>(
        strategy, precision,
        [&](auto s, auto p) { return run<typename decltype(s)::type, typename decltype(p)::type>(ranks, cfg, out); },
        fsdp::named<fsdp::precision::scaled<fsdp::float8_e4m3, 16>>{"fp8"},
        fsdp::named<fsdp::precision::scaled<std::int8_t, 16>>{"int8"},
        fsdp::named<fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>{"int8-qgz"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
