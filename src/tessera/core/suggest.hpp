// "Did you mean": the closest of some names to a word that is none of them (a typo), for the
// hints of errors about unknown keys, commands and options.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Levenshtein distance (insertions, deletions, substitutions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The closest candidate if it is close enough to be a likely typo (at most max(2, |word| / 3)
// edits), else "".
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace tessera
