// Charts as PNG or SVG files, drawn by PLplot (its cairo drivers): series of x/y points on axes
// with ticks, labels, a title and a legend. One small plain API for the commands and the studies:
// fill in Charts, call draw.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::plot {

enum class Style {
  Line,     // points joined in order (a non-finite y breaks the line)
  Points,   // a small mark per point
  Impulses  // a vertical bar from the bottom of the axes to each point
};

struct Series {
  std::string label;  // the legend entry; empty: not in the legend
  std::vector<double> x, y;
  Style style = Style::Line;
  std::string color;  // "#rrggbb"; empty: the palette's next colour
};

struct Chart {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;  // points <= 0 on a log axis are left out
  std::vector<Series> series{};
  // Named x positions: when given, category i sits at x = i and is written under the axis in
  // place of the numbers (x from -0.5 to size - 0.5; a series may offset its points within).
  std::vector<std::string> x_categories{};
};

struct Page {
  int width = 960, height = 600;  // pixels (PNG) or points (SVG), the whole page
  int columns = 1;                // panels across; rows follow from the number of charts
};

// Draws the charts, one panel each, into `out`: PNG for ".png", SVG for ".svg" (any other
// extension is an Error). Written to a temporary file and renamed.
void draw(const std::vector<Chart>& charts, const std::filesystem::path& out,
          const Page& page = {});
void draw(const Chart& chart, const std::filesystem::path& out, const Page& page = {});

}  // namespace tessera::plot
