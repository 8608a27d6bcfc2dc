// tessera tokenize: text -> token ids (GPT-2's, or a model's own tokenizer), or ids -> text with
// --decode.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "model_paths.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/io/tokenizer_files.hpp"

namespace tessera::app {
namespace {

struct TokenizeOptions {
  std::string input = "-";
  std::string tokenizer = "data/gpt2";
  bool decode = false;
  bool no_special = false;
};

std::string read_input(const std::string& input) {
  if (input != "-") return read_file(input, "input file");
  std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) throw Error("cannot read standard input");
  return data;
}

void write_stdout(const std::string& s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size())
    throw Error("cannot write to standard output");
  std::fflush(stdout);
}

void run_tokenize(const TokenizeOptions& o) {
  const std::string input = read_input(o.input);
  const auto tok = io::load_tokenizer(resolve_tokenizer_path(o.tokenizer));
  if (!o.decode) {
    const auto ids = tok.encode(input, !o.no_special);
    std::string out;
    out.reserve(ids.size() * 6 + 1);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
    write_stdout(out);
    return;
  }
  write_stdout(tok.decode(data::parse_token_ids(input)));
}

}  // namespace

void add_tokenize_command(CLI::App& root) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = root.add_subcommand(
      "tokenize", "print the token ids of a text (or, with --decode, the text of ids)");
  cmd->add_option("input", o->input, "file to read, or - for standard input")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a model's .gguf file or tokenizer.json, or a directory holding tokenizer.json "
                  "or GPT-2's encoder.json and vocab.bpe")
      ->capture_default_str();
  cmd->add_flag("--decode", o->decode, "read token ids and print their text");
  cmd->add_flag("--no-special", o->no_special,
                "encode special tokens (GPT-2's <|endoftext|>, a model's control tokens) as "
                "plain text");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace tessera::app
