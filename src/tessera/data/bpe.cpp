#include "tessera/data/bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::data {
namespace {

// The GPT-2 pre-tokenizer (openai/gpt-2 src/encoder.py); Hugging Face's ByteLevel pre-tokenizer
// uses the same regex.
constexpr std::string_view k_gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Hugging Face's Digits(individual_digits=True): every numeric character alone.
constexpr std::string_view k_digit_pattern = R"(\p{N})";
// Llama 3's Split regex (its tokenizer.json, as Hugging Face tokenizers runs it).
constexpr std::string_view k_llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_eot_text = "<|endoftext|>";
constexpr const char* k_setup_hint = "run scripts/setup to fetch the GPT-2 tokenizer files";

// Pieces up to this many bytes use the quadratic reference loop; longer ones the heap version
// (same result, O(n log n)). Pieces up to k_cache_max_piece bytes are cached.
constexpr std::size_t k_small_piece = 48;
constexpr std::size_t k_cache_max_piece = 64;
constexpr std::size_t k_cache_shards = 16;
constexpr std::size_t k_cache_shard_limit = std::size_t{1} << 16;

// GPT-2 bytes_to_unicode(): printable latin-1 bytes map to themselves, the other 68 bytes to
// code points 256.. in byte order. Returns byte -> code point.
std::array<std::uint32_t, 256> bytes_to_unicode() {
  std::array<std::uint32_t, 256> cp{};
  std::uint32_t n = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? b : 256 + n++;
  }
  return cp;
}

// Decodes a UTF-8 key of encoder.json / vocab.bpe (unicode stand-ins for bytes) back to bytes.
// Returns false when the key holds a code point that is not one of the 256 stand-ins.
bool unicode_key_to_bytes(std::string_view key, const std::vector<int>& cp_to_byte,
                          std::string& out) {
  out.clear();
  std::size_t i = 0;
  while (i < key.size()) {
    auto c = static_cast<unsigned char>(key[i]);
    std::uint32_t cp;
    std::size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1F;
      len = 2;
    } else if ((c >> 4) == 0xE) {
      cp = c & 0x0F;
      len = 3;
    } else {
      return false;  // the stand-ins are all below U+0800
    }
    if (i + len > key.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(key[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(cp_to_byte[cp]));
    i += len;
  }
  return !out.empty();
}

struct TransparentHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

struct Merge {
  std::uint32_t rank;
  std::uint32_t merged;  // id of left + right
};

constexpr std::uint32_t k_no_token = 0xFFFFFFFFu;

constexpr std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) {
  return (static_cast<std::uint64_t>(a) << 32) | b;
}

struct MatchData {
  explicit MatchData(const pcre2_code* re) : md(pcre2_match_data_create_from_pattern(re, nullptr)) {
    if (!md) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* md;
};

// A compiled regex, freed with it.
struct Regex {
  explicit Regex(std::string_view pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InternalError(fmt::format("cannot compile the pre-tokenizer regex {}: {}", pattern,
                                      reinterpret_cast<char*>(msg)));
    }
    // JIT is an optimization only: without it pcre2_match interprets the same pattern.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  pcre2_code* code = nullptr;
};

}  // namespace

std::vector<std::string_view> pre_tokenizer_regexes(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return {k_gpt2_pattern};
    case PreTokenizer::Digits:
      return {k_digit_pattern, k_gpt2_pattern};
    case PreTokenizer::Llama3:
      return {k_llama3_pattern};
  }
  throw InternalError("unknown pre-tokenizer");
}

namespace {

struct Special {
  std::string text;
  std::uint32_t id;
};

// One piece of a SentencePiece encoding: bytes [start, start + len) of the escaped text (len 0
// once merged into its left neighbour), in a list of the pieces still there; its token once known
// (a merge's result, or looked up where merges go by rank), else k_none.
struct SpmSymbol {
  static constexpr std::uint32_t k_none = 0xFFFFFFFFu;
  std::size_t start, len;
  std::int64_t prev, next;  // -1: none
  std::uint32_t id = k_none;
};

}  // namespace

std::string_view pre_tokenizer_name(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::Gpt2:
      return "gpt2";
    case PreTokenizer::Digits:
      return "smollm";
    case PreTokenizer::Llama3:
      return "llama-bpe";
  }
  return "?";
}

struct Tokenizer::Impl {
  PreTokenizer pre = PreTokenizer::Gpt2;
  std::vector<std::unique_ptr<Regex>> stages;  // applied in order, each to the previous' pieces
  std::vector<std::string> bytes_of;           // id -> raw bytes, (vocab,)
  std::array<std::uint32_t, 256> byte_id{};    // k_no_token: the byte has none
  std::size_t missing_bytes = 0;
  std::unordered_map<std::uint64_t, Merge> merges;
  // Ordinary (not special) tokens by their bytes; used whole when ignore_merges.
  std::unordered_map<std::string, std::uint32_t, TransparentHash, std::equal_to<>> id_of;
  bool ignore_merges = false;
  std::vector<Special> specials;
  std::array<std::vector<std::uint32_t>, 256> specials_by_first{};  // first byte -> indices
  std::optional<std::uint32_t> eot, bos, eos;
  std::string source;
  bool add_bos = false;
  BpeVocab vocab;
  // SentencePiece: id_of holds every token by its spelling (the last of equal ones, as
  // llama.cpp), vocab.scores their scores; the token of a byte without one; a space first.
  TokenizerKind kind = TokenizerKind::ByteLevelBpe;
  std::optional<std::uint32_t> unk;
  SpacePrefix space_prefix = SpacePrefix::None;

  using Bad = std::function<Error(const std::string&)>;
  void index_specials(const BpeVocab& vocab, const Bad& bad);
  void index_tokens(BpeVocab& vocab, const Bad& bad);
  void index_pieces(BpeVocab& vocab, const Bad& bad);
  void index_merges(const BpeVocab& vocab, const Bad& bad);
  void encode_pieces(std::string_view text, bool prefix, std::vector<std::uint32_t>& out) const;
  void merge_pieces(const std::string& s, std::vector<SpmSymbol>& sym) const;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<std::uint32_t>, TransparentHash, std::equal_to<>>
        map;
  };
  mutable std::array<CacheShard, k_cache_shards> cache;

  const Merge* find_merge(std::uint32_t a, std::uint32_t b) const {
    auto it = merges.find(pair_key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }

  // The tokens of the piece's bytes, into dst (piece.size() room); returns how many. A byte
  // without a token is left out, as Hugging Face's BPE (no unk token) and llama.cpp do; its
  // neighbours then meet and may merge.
  std::size_t byte_ids(std::string_view piece, std::uint32_t* dst) const {
    std::size_t n = 0;
    for (char c : piece) {
      const std::uint32_t id = byte_id[static_cast<unsigned char>(c)];
      if (id != k_no_token) dst[n++] = id;
    }
    return n;
  }

  // Reference loop (openai/gpt-2 encoder.py `bpe`): repeatedly take the adjacent pair of lowest
  // rank and merge all its occurrences left to right.
  void bpe_small(std::string_view piece, std::vector<std::uint32_t>& out) const {
    std::array<std::uint32_t, k_small_piece> w;
    std::size_t n = byte_ids(piece, w.data());
    while (n > 1) {
      const Merge* best = nullptr;
      std::uint32_t a = 0, b = 0;
      for (std::size_t i = 0; i + 1 < n; ++i) {
        const Merge* m = find_merge(w[i], w[i + 1]);
        if (m && (!best || m->rank < best->rank)) {
          best = m;
          a = w[i];
          b = w[i + 1];
        }
      }
      if (!best) break;
      std::size_t j = 0;
      for (std::size_t i = 0; i < n;) {
        if (i + 1 < n && w[i] == a && w[i + 1] == b) {
          w[j++] = best->merged;
          i += 2;
        } else {
          w[j++] = w[i++];
        }
      }
      n = j;
    }
    out.insert(out.end(), w.begin(), w.begin() + static_cast<std::ptrdiff_t>(n));
  }

  // The same result in O(n log n) for long pieces: a heap of candidate pairs ordered by
  // (rank, position). All candidates of one rank are one pair; they are merged in position order
  // (skipping overlaps, as the reference does) before any pair created by those merges enters
  // the heap, so the order of merges is exactly the reference's.
  void bpe_large(std::string_view piece, std::vector<std::uint32_t>& out) const {
    std::vector<std::uint32_t> id(piece.size());
    const std::size_t n = byte_ids(piece, id.data());
    if (n == 0) return;
    std::vector<std::int64_t> prev(n), next(n);
    std::vector<char> dead(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<std::int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<std::int64_t>(i) + 1 : -1;
    }
    struct Cand {
      std::uint32_t rank;
      std::int64_t pos;
      std::uint32_t left, right, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto consider = [&](std::int64_t l) {
      std::int64_t r = next[l];
      if (r < 0) return;
      if (const Merge* m = find_merge(id[l], id[r]))
        heap.push({m->rank, l, id[l], id[r], m->merged});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) consider(static_cast<std::int64_t>(i));
    std::vector<std::int64_t> touched;
    while (!heap.empty()) {
      const std::uint32_t rank = heap.top().rank;
      touched.clear();
      while (!heap.empty() && heap.top().rank == rank) {
        Cand c = heap.top();
        heap.pop();
        std::int64_t l = c.pos;
        if (dead[l] || id[l] != c.left) continue;
        std::int64_t r = next[l];
        if (r < 0 || id[r] != c.right) continue;
        id[l] = c.merged;
        dead[r] = 1;
        next[l] = next[r];
        if (next[r] >= 0) prev[next[r]] = l;
        touched.push_back(l);
      }
      for (std::int64_t l : touched) {
        if (dead[l]) continue;
        if (prev[l] >= 0) consider(prev[l]);
        consider(l);
      }
    }
    for (std::int64_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
  }

  void bpe(std::string_view piece, std::vector<std::uint32_t>& out) const {
    if (piece.size() <= k_small_piece)
      bpe_small(piece, out);
    else
      bpe_large(piece, out);
  }

  void encode_piece(std::string_view piece, std::vector<std::uint32_t>& out) const {
    if (piece.empty()) return;
    if (piece.size() == 1) {
      const std::uint32_t id = byte_id[static_cast<unsigned char>(piece[0])];
      if (id != k_no_token) out.push_back(id);
      return;
    }
    if (ignore_merges) {
      auto it = id_of.find(piece);
      if (it != id_of.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (piece.size() > k_cache_max_piece) {
      bpe(piece, out);
      return;
    }
    const std::size_t h = TransparentHash{}(piece);
    CacheShard& shard = cache[(h >> 7) % k_cache_shards];
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      auto it = shard.map.find(piece);
      if (it != shard.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const std::size_t start = out.size();
    bpe(piece, out);
    std::vector<std::uint32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= k_cache_shard_limit) shard.map.clear();
    shard.map.emplace(std::string(piece), std::move(ids));
  }

  // Encodes `text` (no special tokens): byte-level BPE pre-tokenizes it and encodes every piece;
  // SentencePiece encodes it whole, after a space where the vocabulary puts one (`start`: the
  // text is at the start of what is encoded; `first`: there or after a special token).
  void encode_ordinary(std::string_view text, bool start, bool first,
                       std::vector<std::uint32_t>& out) const {
    if (kind == TokenizerKind::SentencePiece)
      encode_pieces(text,
                    space_prefix == SpacePrefix::EveryPart
                        ? first
                        : start && space_prefix == SpacePrefix::Start,
                    out);
    else
      split(text, 0, out);
  }

  // Cuts `text` with stage `stage`'s regex into its matches and the stretches between them
  // (which only invalid UTF-8 or an earlier stage's leftovers make), passing each on to the next
  // stage; after the last stage each piece is encoded.
  void split(std::string_view text, std::size_t stage, std::vector<std::uint32_t>& out) const {
    if (text.empty()) return;
    if (stage == stages.size()) {
      encode_piece(text, out);
      return;
    }
    const pcre2_code* re = stages[stage]->code;
    MatchData md(re);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const std::size_t n = text.size();
    std::size_t start = 0;
    while (start < n) {
      int rc = pcre2_match(re, subject, n, start, 0, md.md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, subject, n, start, PCRE2_NO_JIT, md.md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {
        split(text.substr(start), stage + 1, out);  // the rest, which no match covers
        return;
      }
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw InternalError(fmt::format("{} pre-tokenizer failed at byte {}: {}",
                                        pre_tokenizer_name(pre), start,
                                        reinterpret_cast<char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
      const std::size_t s = ov[0], e = ov[1];
      TESSERA_CHECK(s >= start && e > s && e <= n, "pre-tokenizer match [{}, {}) from {}", s, e,
                    start);
      if (s > start) split(text.substr(start, s - start), stage + 1, out);
      split(text.substr(s, e - s), stage + 1, out);
      start = e;
    }
  }

  // The first special token at or after `pos` (leftmost, then longest): its offset, or npos.
  std::size_t find_special(std::string_view text, std::size_t pos, const Special*& found) const {
    for (std::size_t i = pos; i < text.size(); ++i) {
      found = nullptr;
      for (std::uint32_t k : specials_by_first[static_cast<unsigned char>(text[i])]) {
        const Special& sp = specials[k];
        if (text.substr(i).starts_with(sp.text) && (!found || sp.text.size() > found->text.size()))
          found = &sp;
      }
      if (found) return i;
    }
    return std::string_view::npos;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

Error corrupt_gpt2_file(const std::filesystem::path& p, const std::string& why) {
  return Error(fmt::format("corrupt GPT-2 tokenizer file {}: {}", p.string(), why), k_setup_hint);
}

// encoder.json: {"<token as unicode stand-ins>": id, ...}, ids 0..n-1 each once. Fills the
// vocabulary's tokens and its one special token; returns each token's id by its raw bytes.
std::unordered_map<std::string, std::uint32_t> read_gpt2_encoder(std::string_view text,
                                                                 const std::filesystem::path& path,
                                                                 BpeVocab& vocab) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw corrupt_gpt2_file(path, std::string(library_message(e)));
  }
  if (!j.is_object() || j.empty())
    throw corrupt_gpt2_file(path, "expected a JSON object of token ids");
  const std::size_t n = j.size();
  vocab.tokens.assign(n, {});
  std::vector<char> seen(n, 0);
  std::unordered_map<std::string, std::uint32_t> id_of;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() >= n)
      throw corrupt_gpt2_file(path, fmt::format("token '{}' has a bad id", key));
    auto id = value.get<std::uint32_t>();
    if (seen[id]) throw corrupt_gpt2_file(path, fmt::format("id {} is used twice", id));
    seen[id] = 1;
    auto bytes = byte_level_decode(key);
    if (!bytes) throw corrupt_gpt2_file(path, fmt::format("token '{}' is not byte-level BPE", key));
    if (!id_of.emplace(*bytes, id).second)
      throw corrupt_gpt2_file(path, fmt::format("token '{}' appears twice", key));
    vocab.tokens[id] = std::move(*bytes);
  }
  for (int b = 0; b < 256; ++b)
    if (!id_of.contains(std::string(1, static_cast<char>(b))))
      throw corrupt_gpt2_file(path, fmt::format("no token for byte {}", b));
  auto it = id_of.find(std::string(k_eot_text));
  if (it == id_of.end()) throw corrupt_gpt2_file(path, "no <|endoftext|> token");
  vocab.special_ids = {it->second};
  vocab.bos = vocab.eos = it->second;
  return id_of;
}

// vocab.bpe: "#version: 0.2" then one merge "left right" per line, in rank order; each side and
// their concatenation must be tokens of encoder.json.
void read_gpt2_merges(std::string_view text, const std::filesystem::path& path,
                      const std::unordered_map<std::string, std::uint32_t>& id_of,
                      BpeVocab& vocab) {
  for_each_line(text, [&](std::string_view line, std::size_t line_no) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if ((line_no == 1 && line.starts_with("#version")) || line.empty()) return;
    const std::size_t sp = line.find(' ');
    std::optional<std::string> left, right;
    if (sp != std::string_view::npos && line.find(' ', sp + 1) == std::string_view::npos) {
      left = byte_level_decode(line.substr(0, sp));
      right = byte_level_decode(line.substr(sp + 1));
    }
    if (!left || !right)
      throw corrupt_gpt2_file(path, fmt::format("line {} is not a merge 'left right'", line_no));
    if (!id_of.contains(*left) || !id_of.contains(*right) || !id_of.contains(*left + *right))
      throw corrupt_gpt2_file(
          path, fmt::format("line {}: merge uses a token missing from encoder.json", line_no));
    vocab.merges.emplace_back(std::move(*left), std::move(*right));
  });
  if (vocab.merges.empty()) throw corrupt_gpt2_file(path, "no merges");
}

}  // namespace

BpeVocab gpt2_vocab_from_text(std::string_view encoder_json, std::string_view merges,
                              const std::filesystem::path& encoder_path,
                              const std::filesystem::path& merges_path) {
  BpeVocab vocab;
  vocab.source = fmt::format("GPT-2 tokenizer {}", encoder_path.parent_path().string());
  const auto id_of = read_gpt2_encoder(encoder_json, encoder_path, vocab);
  read_gpt2_merges(merges, merges_path, id_of, vocab);
  return vocab;
}

Tokenizer Tokenizer::load_gpt2(const std::filesystem::path& dir) {
  const auto enc_path = dir / "encoder.json";
  const auto bpe_path = dir / "vocab.bpe";
  for (const auto& p : {enc_path, bpe_path}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec))
      throw Error(fmt::format("GPT-2 tokenizer file not found: {}", p.string()),
                  fmt::format("{}, or pass --tokenizer DIR", k_setup_hint));
  }
  const std::string encoder_json = read_file(enc_path, "GPT-2 encoder.json");
  const std::string merges = read_file(bpe_path, "GPT-2 vocab.bpe");
  return from_vocab(gpt2_vocab_from_text(encoder_json, merges, enc_path, bpe_path));
}

// Checks the ids the vocabulary names and indexes its special tokens (by their text).
void Tokenizer::Impl::index_specials(const BpeVocab& vocab, const Bad& bad) {
  if (vocab.tokens.empty()) throw bad("it has no tokens");
  if (vocab.tokens.size() > std::numeric_limits<std::uint32_t>::max())
    throw bad(fmt::format("{} tokens is more than ids can number", vocab.tokens.size()));
  const auto n = static_cast<std::uint32_t>(vocab.tokens.size());
  for (std::optional<std::uint32_t> id : {vocab.bos, vocab.eos, vocab.unk})
    if (id && *id >= n) throw bad(fmt::format("token id {} is past the {} tokens", *id, n));
  std::vector<char> special(n, 0);
  for (std::uint32_t id : vocab.special_ids) {
    if (id >= n) throw bad(fmt::format("special token id {} is past the {} tokens", id, n));
    if (vocab.tokens[id].empty()) throw bad(fmt::format("special token {} is empty", id));
    if (special[id]++) continue;
    const auto k = static_cast<std::uint32_t>(specials.size());
    specials.push_back({vocab.tokens[id], id});
    specials_by_first[static_cast<unsigned char>(vocab.tokens[id][0])].push_back(k);
  }
}

// Byte-level BPE: bytes_of, id_of (ordinary tokens by their bytes), byte_id.
void Tokenizer::Impl::index_tokens(BpeVocab& vocab, const Bad& bad) {
  const auto n = static_cast<std::uint32_t>(vocab.tokens.size());
  std::vector<char> special(n, 0);
  for (std::uint32_t id : vocab.special_ids) special[id] = 1;
  bytes_of = std::move(vocab.tokens);
  for (std::uint32_t id = 0; id < n; ++id)
    if (!special[id] && !bytes_of[id].empty())
      id_of.emplace(bytes_of[id], id);  // the lowest id of equal tokens wins
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, static_cast<char>(b)));
    byte_id[b] = it == id_of.end() ? k_no_token : it->second;
    missing_bytes += it == id_of.end();
  }
  if (missing_bytes == 256) throw bad("no byte has a token");
}

namespace {

constexpr std::string_view k_spm_space = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

std::optional<unsigned char> byte_token_value(std::string_view spelled) {
  if (spelled.size() != 6 || !spelled.starts_with("<0x") || spelled[5] != '>') return std::nullopt;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(spelled.data() + 3, spelled.data() + 5, value, 16);
  if (ec != std::errc() || end != spelled.data() + 5) return std::nullopt;
  return static_cast<unsigned char>(value);
}

namespace {

// A normal SentencePiece token's text: U+2581 back to spaces.
std::string spm_text(std::string_view spelled) {
  std::string out;
  out.reserve(spelled.size());
  for (std::size_t i = 0; i < spelled.size();) {
    if (spelled.substr(i).starts_with(k_spm_space)) {
      out += ' ';
      i += k_spm_space.size();
    } else {
      out += spelled[i++];
    }
  }
  return out;
}

}  // namespace

// SentencePiece: bytes_of (what each token decodes to), id_of (every token by its spelling),
// scores, byte_id (a byte's <0xXX> token, else a token spelled as that one byte, as llama.cpp).
void Tokenizer::Impl::index_pieces(BpeVocab& vocab, const Bad& bad) {
  const std::size_t n = vocab.tokens.size();
  if (vocab.scores.size() != n || vocab.types.size() != n)
    throw bad(fmt::format("{} scores and {} token types for {} tokens", vocab.scores.size(),
                          vocab.types.size(), n));
  bytes_of.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    const std::string& spelled = vocab.tokens[id];
    if (!std::isfinite(vocab.scores[id]))
      throw bad(fmt::format("token {} has the score {}", id, vocab.scores[id]));
    if (vocab.types[id] == TokenType::Byte) {
      const auto byte = byte_token_value(spelled);
      if (!byte) throw bad(fmt::format("byte token {} is not spelled <0xXX>", id));
      bytes_of[id] = std::string(1, static_cast<char>(*byte));
    } else {
      bytes_of[id] = vocab.types[id] == TokenType::Normal ? spm_text(spelled) : spelled;
    }
    if (!spelled.empty()) id_of.insert_or_assign(spelled, static_cast<std::uint32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(fmt::format("<0x{:02X}>", b));
    if (it == id_of.end()) it = id_of.find(std::string(1, static_cast<char>(b)));
    byte_id[b] = it == id_of.end() ? k_no_token : it->second;
    missing_bytes += it == id_of.end();
  }
  if (missing_bytes == 256 && !vocab.unk) throw bad("no byte has a token and none is unknown");
}

namespace {

// `text` as SentencePiece sees it: U+2581 for every space, and one before it where `prefix`.
std::string spm_escape(std::string_view text, bool prefix) {
  std::string s(prefix ? k_spm_space : "");
  s.reserve(text.size() + 3);
  for (char c : text) s += c == ' ' ? k_spm_space : std::string_view(&c, 1);
  return s;
}

// The UTF-8 characters of `s` as a list of symbols (a byte that starts none is one alone, and
// a character cut short by the end is what is left of it), as llama.cpp cuts them.
std::vector<SpmSymbol> utf8_symbols(const std::string& s) {
  static constexpr std::array<std::uint8_t, 16> k_len{1, 1, 1, 1, 1, 1, 1, 1,
                                                      1, 1, 1, 1, 2, 2, 3, 4};
  std::vector<SpmSymbol> sym;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len =
        std::min<std::size_t>(k_len[static_cast<unsigned char>(s[i]) >> 4], s.size() - i);
    const auto k = static_cast<std::int64_t>(sym.size());
    sym.push_back({i, len, k - 1, i + len < s.size() ? k + 1 : -1});
    i += len;
  }
  return sym;
}

}  // namespace

// Merges neighbours of `sym` (over the escaped text `s`) while a pair spells a token: the pair of
// the highest score first, and of equal scores the leftmost. A vocabulary with a merges list (a
// tokenizer.json's) merges only the pairs it lists, the lowest rank first, as Hugging Face's BPE.
void Tokenizer::Impl::merge_pieces(const std::string& s, std::vector<SpmSymbol>& sym) const {
  struct Pair {
    double score;  // the token's score, or minus the merge's rank
    std::int64_t left, right;
    std::uint32_t len;  // bytes of the two (a piece of one text; 32 bytes a pair, for the heap)
    std::uint32_t id;   // the token the two make
  };
  auto after = [](const Pair& a, const Pair& b) {  // a merges after b
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(after)> queue(after);
  auto consider = [&](std::int64_t l, std::int64_t r) {
    if (l < 0 || r < 0) return;
    const auto len = static_cast<std::uint32_t>(sym[l].len + sym[r].len);
    if (merges.empty()) {
      if (auto it = id_of.find(std::string_view(s.data() + sym[l].start, len)); it != id_of.end())
        queue.push({vocab.scores[it->second], l, r, len, it->second});
    } else if (sym[l].id != SpmSymbol::k_none && sym[r].id != SpmSymbol::k_none) {
      if (const Merge* m = find_merge(sym[l].id, sym[r].id))
        queue.push({-static_cast<double>(m->rank), l, r, len, m->merged});
    }
  };
  if (!merges.empty())  // pairs go by the tokens of their two sides: each character's, once
    for (auto& x : sym)
      if (auto it = id_of.find(std::string_view(s.data() + x.start, x.len)); it != id_of.end())
        x.id = it->second;
  for (std::size_t k = 1; k < sym.size(); ++k)
    consider(static_cast<std::int64_t>(k) - 1, static_cast<std::int64_t>(k));
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    SpmSymbol &l = sym[p.left], &r = sym[p.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.len) continue;  // one side merged since
    l.len += r.len;
    l.id = p.id;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    consider(l.prev, p.left);
    consider(p.left, l.next);
  }
}

// One SentencePiece encoding (see bpe.hpp): the escaped text's characters merged, then each
// piece's token, or its bytes' tokens (the unknown token for a byte without one).
void Tokenizer::Impl::encode_pieces(std::string_view text, bool prefix,
                                    std::vector<std::uint32_t>& out) const {
  const std::string s = spm_escape(text, prefix);
  std::vector<SpmSymbol> sym = utf8_symbols(s);
  merge_pieces(s, sym);
  for (std::int64_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) {
    const std::string_view piece(s.data() + sym[k].start, sym[k].len);
    if (sym[k].id != SpmSymbol::k_none) {
      out.push_back(sym[k].id);
      continue;
    }
    if (auto it = id_of.find(piece); it != id_of.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : piece) {
      const std::uint32_t id = byte_id[static_cast<unsigned char>(c)];
      if (id != k_no_token)
        out.push_back(id);
      else if (unk)
        out.push_back(*unk);
    }
  }
}

// Ranks the merges: (left id, right id) -> rank and merged id. Later duplicates win, as in the
// GPT-2 reference's dict(zip(merges, range(...))) and Hugging Face's BPE.
void Tokenizer::Impl::index_merges(const BpeVocab& vocab, const Bad& bad) {
  std::uint32_t rank = 0;
  for (const auto& [left, right] : vocab.merges) {
    auto a = id_of.find(left), b = id_of.find(right);
    auto m = id_of.find(left + right);
    if (a == id_of.end() || b == id_of.end() || m == id_of.end())
      throw bad(fmt::format("merge {} uses a token that is not in the vocabulary", rank));
    merges.insert_or_assign(pair_key(a->second, b->second), Merge{rank++, m->second});
  }
}

Tokenizer Tokenizer::from_vocab(BpeVocab vocab) {
  const std::string source = vocab.source;
  const bool spm = vocab.kind == TokenizerKind::SentencePiece;
  auto bad = [source, spm](const std::string& why) {
    return Error(fmt::format("{} is not a usable {} tokenizer: {}", source,
                             spm ? "SentencePiece" : "byte-level BPE", why));
  };
  auto impl = std::make_unique<Impl>();
  impl->vocab = vocab;  // as given, for writing it out again (vocab())
  impl->kind = vocab.kind;
  impl->pre = vocab.pre;
  impl->ignore_merges = vocab.ignore_merges;
  impl->bos = vocab.bos;
  impl->eos = vocab.eos;
  impl->unk = vocab.unk;
  impl->add_bos = vocab.add_bos && vocab.bos.has_value();
  impl->space_prefix = spm ? vocab.space_prefix : SpacePrefix::None;
  impl->index_specials(vocab, bad);
  if (spm) {
    impl->index_pieces(vocab, bad);
  } else {
    impl->index_tokens(vocab, bad);
  }
  impl->index_merges(vocab, bad);
  const Special* eot = nullptr;
  for (const Special& sp : impl->specials)
    if (sp.text == k_eot_text) eot = &sp;
  impl->eot = eot ? std::optional(eot->id) : impl->eos;
  impl->source = source;
  for (std::string_view pattern : pre_tokenizer_regexes(vocab.pre))
    impl->stages.push_back(std::make_unique<Regex>(pattern));
  return Tokenizer(std::move(impl));
}

std::vector<std::uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 4 + 8);
  encode_append(text, out, allow_special);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<std::uint32_t>& out,
                              bool allow_special) const {
  bool first = true;  // at the start, or after a special token
  auto ordinary = [&](std::string_view part) {
    if (part.empty()) return;
    impl_->encode_ordinary(part, part.data() == text.data(), first, out);
    first = false;
  };
  if (!allow_special) {
    ordinary(text);
    return;
  }
  std::size_t pos = 0;
  while (true) {
    const Special* sp = nullptr;
    std::size_t hit = impl_->find_special(text, pos, sp);
    if (hit == std::string_view::npos) {
      ordinary(text.substr(pos));
      return;
    }
    ordinary(text.substr(pos, hit - pos));
    out.push_back(sp->id);
    first = true;
    pos = hit + sp->text.size();
  }
}

const BpeVocab& Tokenizer::vocab() const {
  return impl_->vocab;
}

std::string Tokenizer::decode(std::span<const std::uint32_t> ids) const {
  std::string out;
  for (std::uint32_t id : ids) {
    if (id >= impl_->bytes_of.size())
      throw Error(fmt::format("token id {} is out of range (vocabulary has {} tokens)", id,
                              impl_->bytes_of.size()),
                  "ids must come from the same tokenizer");
    out += impl_->bytes_of[id];
  }
  return out;
}

std::string Tokenizer::token_bytes(std::uint32_t id) const {
  if (id >= impl_->bytes_of.size())
    throw Error(fmt::format("token id {} is out of range (vocabulary has {} tokens)", id,
                            impl_->bytes_of.size()));
  return impl_->bytes_of[id];
}

std::uint32_t Tokenizer::eot_id() const {
  if (!impl_->eot)
    throw Error(fmt::format("{} has neither an <|endoftext|> token nor an end-of-sequence token",
                            impl_->source),
                "a tokenizer.json needs tokenizer_config.json beside it naming eos_token");
  return *impl_->eot;
}
std::optional<std::uint32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<std::uint32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
std::vector<std::int32_t> Tokenizer::prompt(std::string_view text) const {
  std::vector<std::int32_t> ids;
  if (add_bos()) ids.push_back(static_cast<std::int32_t>(*bos_id()));
  for (auto id : encode(text)) ids.push_back(static_cast<std::int32_t>(id));
  if (ids.empty()) ids.push_back(static_cast<std::int32_t>(eot_id()));
  return ids;
}
PreTokenizer Tokenizer::pre_tokenizer() const {
  return impl_->pre;
}
TokenizerKind Tokenizer::kind() const {
  return impl_->kind;
}
std::size_t Tokenizer::vocab_size() const {
  return impl_->bytes_of.size();
}
std::size_t Tokenizer::bytes_without_token() const {
  return impl_->missing_bytes;
}
std::size_t Tokenizer::merges_count() const {
  return impl_->merges.size();
}

std::optional<std::string> byte_level_decode(std::string_view spelled) {
  static const std::vector<int> cp_to_byte = [] {
    std::vector<int> t(512, -1);
    const auto unicode_of = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) t[unicode_of[b]] = b;
    return t;
  }();
  std::string out;
  if (!unicode_key_to_bytes(spelled, cp_to_byte, out)) return std::nullopt;
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  static const auto unicode_of = bytes_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const std::uint32_t cp = unicode_of[static_cast<unsigned char>(c)];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {  // all stand-ins are below U+0800: two bytes
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::vector<std::uint32_t> parse_token_ids(std::string_view text) {
  auto is_separator = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']';
  };
  std::vector<std::uint32_t> ids;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    while (p < end && is_separator(*p)) ++p;
    if (p == end) break;
    const char* q = p;
    while (q < end && !is_separator(*q)) ++q;
    std::uint32_t id = 0;
    auto [ptr, ec] = std::from_chars(p, q, id);
    if (ec != std::errc() || ptr != q)
      throw Error(
          fmt::format("not a token id: '{}'", std::string(p, std::min<std::size_t>(q - p, 40))),
          "--decode reads token ids separated by spaces, newlines or commas");
    ids.push_back(id);
    p = q;
  }
  return ids;
}

}  // namespace tessera::data
