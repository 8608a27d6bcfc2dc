// Strict reading of TOML files: a syntax error names file:line:column; the getters check each
// value's type and say where (file, line, key) a wrong one is; unknown keys are errors with the
// closest valid key as a hint. The run config (train/run_config.cpp) and the performance model's
// cluster and model files (perf/) all read through this one reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

namespace tessera {

// A value's type and content in a few words: "string \"abc\"", "float 1.5", "table".
std::string describe_toml(const toml::node& n);
// `s` as a TOML basic string: quoted, with escapes.
std::string toml_quote(std::string_view s);
// `x` as a TOML float that reads back exactly: "1.0", "0.0003", "inf".
std::string toml_float(double x);
// "section.key", or "key" for the root (section "").
std::string dotted_key(std::string_view section, std::string_view key);

class TomlReader {
 public:
  // Parses `text`. A syntax error throws tessera::Error "source:line:col: TOML syntax error: ..."
  // with `hint`, which the getters' errors carry too.
  TomlReader(std::string_view text, std::string source, std::string hint);

  toml::table& root() { return root_; }
  const toml::table& root() const { return root_; }
  const std::string& source() const { return source_; }

  // "source (line N)" for a node read from the text; the source alone for one made in code.
  std::string where(const toml::source_region& src) const;
  // Throws "source: what: message" with the reader's hint.
  [[noreturn]] void fail(std::string_view what, std::string_view message) const;

  // The table `name` under the root ("" = the root); nullptr when absent and not required.
  const toml::table* table(const std::string& name, bool required) const;

  // The value of `key` in table `t` of section `section` ("" = the root), or `def` when the key
  // is absent (or `t` is null). A missing required key or a value of another type throws, and so
  // does a number that is not finite (inf, nan).
  double number(const toml::table* t, const std::string& section, const std::string& key,
                bool required, double def = 0) const;
  int integer(const toml::table* t, const std::string& section, const std::string& key,
              bool required, int def = 0) const;
  bool boolean(const toml::table* t, const std::string& section, const std::string& key,
               bool required, bool def = false) const;
  std::string string(const toml::table* t, const std::string& section, const std::string& key,
                     bool required, std::string def = {}) const;

  // Every key of `t` (section `section`) must be one of `allowed`; else unknown_key.
  void only_keys(const toml::table* t, const std::string& section,
                 const std::vector<std::string>& allowed) const;

  // The errors, also for readers that check values against a schema of their own:
  // "unknown key 'section.key' in <where>", hinting at the closest of `valid` and listing them.
  [[noreturn]] static void unknown_key(const std::string& section, const std::string& key,
                                       const std::string& where,
                                       const std::vector<std::string>& valid);
  // "wrong type for 'dotted' in <where>: <requirement>, got <describe_toml(n)>".
  [[noreturn]] static void wrong_type(const std::string& dotted, const std::string& where,
                                      const toml::node& n, std::string_view requirement,
                                      std::string hint);
  // "value <value> for 'dotted' in <where> is out of range for the field".
  [[noreturn]] static void out_of_range(const std::string& dotted, std::string_view value,
                                        const std::string& where, std::int64_t lo, std::int64_t hi);

  // A float, or an integer as a float; nullopt for any other type.
  static std::optional<double> as_number(const toml::node& n);

 private:
  const toml::node* get(const toml::table* t, const std::string& section, const std::string& key,
                        bool required) const;

  std::string source_, hint_;
  toml::table root_;
};

}  // namespace tessera
