// "--name value" options of the benchmarks: each bench binds its fields by name, then parses.
// An unknown option, a missing value or a value that is not a whole number ends the program with
// a message and exit code 2.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

namespace tessera::bench {

// "a,b,c" -> {"a", "b", "c"} ("" -> {""}): the comma-separated lists of options like --grids.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t pos = 0;;) {
    const std::size_t end = s.find(',', pos);
    out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return out;
    pos = end + 1;
  }
}

// The model shape and repetitions every model benchmark takes (--L --C --H --T --B --V --reps).
struct ModelShape {
  int L, C, H, T, B, V, reps;
};

class Options {
 public:
  Options& add_shape(ModelShape& s) {
    return add("L", s.L).add("C", s.C).add("H", s.H).add("T", s.T).add("B", s.B).add("V", s.V).add(
        "reps", s.reps);
  }
  Options& add(const char* name, int& field) {
    opts_.push_back({name, &field});
    return *this;
  }
  Options& add(const char* name, std::string& field) {
    opts_.push_back({name, &field});
    return *this;
  }
  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; i += 2) {
      const std::string k = argv[i];
      const Opt* o = nullptr;
      for (const auto& c : opts_)
        if (k == std::string("--") + c.name) o = &c;
      if (!o) fail("unknown option " + k);
      if (i + 1 >= argc) fail("option " + k + " needs a value");
      const char* v = argv[i + 1];
      if (auto* s = std::get_if<std::string*>(&o->field)) {
        **s = v;
      } else {
        char* end = nullptr;
        const long x = std::strtol(v, &end, 10);
        if (end == v || *end != '\0') fail("option " + k + " takes a whole number, got " + v);
        *std::get<int*>(o->field) = static_cast<int>(x);
      }
    }
  }

 private:
  struct Opt {
    const char* name;
    std::variant<int*, std::string*> field;
  };
  [[noreturn]] void fail(const std::string& msg) const {
    std::string names;
    for (const auto& c : opts_) names += std::string(" --") + c.name;
    std::fprintf(stderr, "%s (options:%s)\n", msg.c_str(), names.c_str());
    std::exit(2);
  }
  std::vector<Opt> opts_;
};

}  // namespace tessera::bench
