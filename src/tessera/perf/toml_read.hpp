// Internal: strict reading of the small TOML files of the performance model (cluster and model
// specs). Unknown keys and wrong types are errors that name the file, section and key.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "tessera/core/error.hpp"

namespace tessera::perf::detail {

class TomlReader {
 public:
  TomlReader(std::string_view text, std::string source, std::string hint)
      : source_(std::move(source)), hint_(std::move(hint)) {
    try {
      root_ = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      throw Error(fmt::format("{}:{}:{}: TOML syntax error: {}", source_, b.line, b.column,
                              e.description()),
                  hint_);
    }
  }

  const toml::table& root() const { return root_; }
  [[noreturn]] void fail(std::string_view where, std::string_view msg) const {
    throw Error(fmt::format("{}: {}: {}", source_, where, msg), hint_);
  }

  // A table at `path` ("" = root); required or optional.
  const toml::table* table(const std::string& name, bool required) const {
    if (name.empty()) return &root_;
    const toml::node* n = root_.get(name);
    if (!n) {
      if (required) fail(fmt::format("[{}]", name), "section missing");
      return nullptr;
    }
    if (!n->is_table()) fail(fmt::format("[{}]", name), "must be a table");
    return n->as_table();
  }

  static std::string where(const std::string& section, const std::string& key) {
    return section.empty() ? key : fmt::format("[{}] {}", section, key);
  }

  double number(const toml::table* t, const std::string& section, const std::string& key,
                bool required, double def = 0) const {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n) {
      if (required) fail(where(section, key), "missing");
      return def;
    }
    if (auto v = n->value<double>()) return *v;
    fail(where(section, key), "must be a number");
  }

  int integer(const toml::table* t, const std::string& section, const std::string& key,
              bool required, int def = 0) const {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n) {
      if (required) fail(where(section, key), "missing");
      return def;
    }
    if (n->is_integer()) {
      auto v = *n->value<std::int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) fail(where(section, key), "out of range");
      return static_cast<int>(v);
    }
    fail(where(section, key), "must be an integer");
  }

  bool boolean(const toml::table* t, const std::string& section, const std::string& key,
               bool required, bool def = false) const {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n) {
      if (required) fail(where(section, key), "missing");
      return def;
    }
    if (auto v = n->value<bool>()) return *v;
    fail(where(section, key), "must be true or false");
  }

  std::string string(const toml::table* t, const std::string& section, const std::string& key,
                     bool required, std::string def = {}) const {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n) {
      if (required) fail(where(section, key), "missing");
      return def;
    }
    if (auto v = n->value<std::string>()) return *v;
    fail(where(section, key), "must be a string");
  }

  // Every key of table `t` must be in `allowed`.
  void only_keys(const toml::table* t, const std::string& section,
                 const std::set<std::string>& allowed) const {
    if (!t) return;
    for (const auto& [k, v] : *t) {
      std::string key(k.str());
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(where(section, key), fmt::format("unknown key (known: {})", list));
      }
    }
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_, hint_;
  toml::table root_;
};

}  // namespace tessera::perf::detail
