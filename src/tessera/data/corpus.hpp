// Corpus converters: raw corpora -> a list of plain-text documents (one std::string each).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// The Brown corpus in NLTK form (files ca01..cr09 of `word/tag` tokens, one sentence per line,
// paragraphs separated by blank lines): one document per file, files sorted by name, paragraphs
// joined with "\n". The conversion is a plain detokenizer (tests/unit/test_corpus.cpp pins it): the
// tag after the LAST '/' is dropped, `` and '' become ", and punctuation is attached to its
// neighbour. Throws tessera::Error with a hint when the directory is missing or holds no Brown
// files.
std::vector<std::string> brown_documents(const std::filesystem::path& dir);

// One Brown file's content -> its document (paragraphs joined with "\n", no trailing newline).
std::string brown_to_text(std::string_view content);

// Plain text: every file is one document, its bytes unchanged. A directory stands for the
// regular files directly inside it, sorted by name. Missing paths throw tessera::Error.
std::vector<std::string> text_documents(const std::vector<std::filesystem::path>& paths);

// JSON Lines: one JSON object per line, the document is the string under `key`. Blank lines are
// skipped. A bad line throws tessera::Error naming the file and the line number.
std::vector<std::string> jsonl_documents(const std::filesystem::path& path,
                                         std::string_view key = "text");
// The same for a JSONL file's text, named `path` in messages.
std::vector<std::string> jsonl_documents_from_text(std::string_view text,
                                                   const std::filesystem::path& path,
                                                   std::string_view key = "text");

}  // namespace tessera::data
