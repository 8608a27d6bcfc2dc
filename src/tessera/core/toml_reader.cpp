#include "tessera/core/toml_reader.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/core/error.hpp"
#include "tessera/core/suggest.hpp"

namespace tessera {

namespace {

std::string node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "value";
  }
}

}  // namespace

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", c);
        else
          out += ch;
    }
  }
  return out + "\"";
}

std::string toml_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", x);  // shortest representation that reads back exactly
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string describe_toml(const toml::node& n) {
  std::string v;
  if (auto s = n.as_string())
    v = toml_quote(s->get());
  else if (auto i = n.as_integer())
    v = fmt::format("{}", i->get());
  else if (auto d = n.as_floating_point())
    v = toml_float(d->get());
  else if (auto b = n.as_boolean())
    v = b->get() ? "true" : "false";
  if (v.size() > 60) v = v.substr(0, 57) + "...";
  return v.empty() ? node_type_name(n) : node_type_name(n) + " " + v;
}

std::string dotted_key(std::string_view section, std::string_view key) {
  return section.empty() ? std::string(key) : fmt::format("{}.{}", section, key);
}

TomlReader::TomlReader(std::string_view text, std::string source, std::string hint)
    : source_(std::move(source)), hint_(std::move(hint)) {
  try {
    root_ = toml::parse(text, source_);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw Error(
        fmt::format("{}:{}:{}: TOML syntax error: {}", source_, b.line, b.column, e.description()),
        hint_);
  }
}

std::string TomlReader::where(const toml::source_region& src) const {
  if (src.begin.line == 0) return source_;
  return fmt::format("{} (line {})", source_, src.begin.line);
}

void TomlReader::fail(std::string_view what, std::string_view message) const {
  throw Error(fmt::format("{}: {}: {}", source_, what, message), hint_);
}

const toml::table* TomlReader::table(const std::string& name, bool required) const {
  if (name.empty()) return &root_;
  const toml::node* n = root_.get(name);
  if (!n) {
    if (required) fail(fmt::format("[{}]", name), "section missing");
    return nullptr;
  }
  if (!n->is_table())
    wrong_type(name, where(n->source()), *n, fmt::format("must be a table ([{}])", name), hint_);
  return n->as_table();
}

const toml::node* TomlReader::get(const toml::table* t, const std::string& section,
                                  const std::string& key, bool required) const {
  const toml::node* n = t ? t->get(key) : nullptr;
  if (!n && required)
    throw Error(fmt::format("missing key '{}' in {}", dotted_key(section, key), source_), hint_);
  return n;
}

double TomlReader::number(const toml::table* t, const std::string& section, const std::string& key,
                          bool required, double def) const {
  const toml::node* n = get(t, section, key, required);
  if (!n) return def;
  const auto v = as_number(*n);
  if (!v) wrong_type(dotted_key(section, key), where(n->source()), *n, "must be a number", hint_);
  // TOML writes inf and nan as floats; no quantity a file gives is either.
  if (!std::isfinite(*v))
    throw Error(fmt::format("'{}' in {} must be a finite number, got {}", dotted_key(section, key),
                            where(n->source()), describe_toml(*n)),
                hint_);
  return *v;
}

int TomlReader::integer(const toml::table* t, const std::string& section, const std::string& key,
                        bool required, int def) const {
  const toml::node* n = get(t, section, key, required);
  if (!n) return def;
  if (!n->is_integer())
    wrong_type(dotted_key(section, key), where(n->source()), *n, "must be an integer", hint_);
  const std::int64_t v = n->as_integer()->get();
  if (v < INT_MIN || v > INT_MAX)
    out_of_range(dotted_key(section, key), std::to_string(v), where(n->source()), INT_MIN, INT_MAX);
  return static_cast<int>(v);
}

bool TomlReader::boolean(const toml::table* t, const std::string& section, const std::string& key,
                         bool required, bool def) const {
  const toml::node* n = get(t, section, key, required);
  if (!n) return def;
  if (!n->is_boolean())
    wrong_type(dotted_key(section, key), where(n->source()), *n, "must be true or false", hint_);
  return n->as_boolean()->get();
}

std::string TomlReader::string(const toml::table* t, const std::string& section,
                               const std::string& key, bool required, std::string def) const {
  const toml::node* n = get(t, section, key, required);
  if (!n) return def;
  if (!n->is_string())
    wrong_type(dotted_key(section, key), where(n->source()), *n, "must be a string", hint_);
  return n->as_string()->get();
}

void TomlReader::only_keys(const toml::table* t, const std::string& section,
                           const std::vector<std::string>& allowed) const {
  if (!t) return;
  for (const auto& [k, v] : *t) {
    std::string key(k.str());
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      unknown_key(section, key, where(k.source()), allowed);
  }
}

void TomlReader::unknown_key(const std::string& section, const std::string& key,
                             const std::string& where, const std::vector<std::string>& valid) {
  const std::string near = closest(key, valid);
  const std::string list =
      fmt::format("valid keys{}: {}", section.empty() ? "" : fmt::format(" in [{}]", section),
                  fmt::join(valid, ", "));
  throw Error(
      fmt::format("unknown key '{}' in {}", dotted_key(section, key), where),
      near.empty() ? list : fmt::format("did you mean '{}'? {}", dotted_key(section, near), list));
}

void TomlReader::wrong_type(const std::string& dotted, const std::string& where,
                            const toml::node& n, std::string_view requirement, std::string hint) {
  throw Error(fmt::format("wrong type for '{}' in {}: {}, got {}", dotted, where, requirement,
                          describe_toml(n)),
              std::move(hint));
}

void TomlReader::out_of_range(const std::string& dotted, std::string_view value,
                              const std::string& where, std::int64_t lo, std::int64_t hi) {
  throw Error(
      fmt::format("value {} for '{}' in {} is out of range for the field", value, dotted, where),
      fmt::format("{} takes an integer between {} and {}", dotted, lo, hi));
}

std::optional<double> TomlReader::as_number(const toml::node& n) {
  if (n.is_floating_point()) return n.as_floating_point()->get();
  if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
  return std::nullopt;
}

}  // namespace tessera
