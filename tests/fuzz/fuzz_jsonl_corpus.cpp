// Fuzz target: a JSON Lines corpus (tessera prepare --corpus jsonl). Any bytes: each line is
// parsed and checked; the documents returned are the lines' "text" strings, one per non-blank
// line.
#include <algorithm>

#include "fuzz_util.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/corpus.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const auto docs = tessera::data::jsonl_documents_from_text(text, "fuzz.jsonl");
    std::size_t lines = 0;
    tessera::for_each_line(text, [&](std::string_view line, std::size_t) {
      lines += line.find_first_not_of(" \t\r") != std::string_view::npos;
    });
    tessera::fuzz::require(docs.size() == lines, "one document per non-blank line");
  });
}
