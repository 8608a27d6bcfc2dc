#include "tessera/plot/plot.hpp"

#include <plplot/plplot.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::plot {

namespace fs = std::filesystem;

namespace {

// Colour map 0 of the stream: 0 background, 1 axes and text, 2 grid, then the series' palette
// (matplotlib's "tab10").
constexpr int k_background = 0, k_ink = 1, k_grid = 2, k_first_series = 3;
constexpr std::array<const char*, 10> k_palette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                   "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                   "#bcbd22", "#17becf"};

std::array<int, 3> rgb(const std::string& hex) {
  if (hex.size() != 7 || hex[0] != '#')
    throw Error(fmt::format("bad colour \"{}\"", hex), "write a colour as #rrggbb");
  std::array<int, 3> c{};
  for (int i = 0; i < 3; ++i) c[i] = std::stoi(hex.substr(1 + 2 * i, 2), nullptr, 16);
  return c;
}

// The device of an output path's extension, or an Error.
const char* device_for(const fs::path& out) {
  std::string ext = out.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  if (ext == ".png") return "pngcairo";
  if (ext == ".svg") return "svgcairo";
  throw Error(fmt::format("cannot draw {}: unknown picture format \"{}\"", out.string(), ext),
              "name the output file .png or .svg");
}

void require_device(const char* device) {
  std::array<const char*, 128> menu{}, names{};  // PLplot fills these (and ends them with null)
  const char** menu_data = menu.data();
  const char** names_data = names.data();
  int n = static_cast<int>(names.size());
  plgFileDevs(&menu_data, &names_data, &n);
  for (int i = 0; i < n; ++i)
    if (std::string(names[i]) == device) return;
  throw Error(fmt::format("PLplot has no {} driver", device),
              "install Debian's plplot-driver-cairo (scripts/setup does)");
}

// A value on an axis: its log10 on a log axis (NaN where not positive).
double axis_value(double v, bool log) {
  if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
  if (!log) return v;
  return v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  // Padded by 3% on each side; an empty or flat range is widened.
  std::pair<double, double> padded() const {
    if (!(lo <= hi)) return {0, 1};
    if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi)))
      return {lo - std::max(0.5, 0.05 * std::fabs(lo)), hi + std::max(0.5, 0.05 * std::fabs(hi))};
    const double pad = 0.03 * (hi - lo);
    return {lo - pad, hi + pad};
  }
};

// One series' points on the chart's axes: finite pairs, in order.
struct Points {
  std::vector<double> x, y;
};
Points axis_points(const Chart& chart, const Series& s) {
  Points p;
  const std::size_t n = std::min(s.x.size(), s.y.size());
  for (std::size_t i = 0; i < n; ++i) {
    p.x.push_back(axis_value(s.x[i], chart.log_x));
    p.y.push_back(axis_value(s.y[i], chart.log_y));
  }
  return p;
}

void draw_series(const Points& p, Style style, double y_bottom) {
  const std::size_t n = p.x.size();
  auto finite = [&](std::size_t i) { return std::isfinite(p.x[i]) && std::isfinite(p.y[i]); };
  if (style == Style::Line) {
    for (std::size_t i = 0; i < n;) {  // each run of finite points is one line
      while (i < n && !finite(i)) ++i;
      std::size_t j = i;
      while (j < n && finite(j)) ++j;
      if (j - i == 1) plpoin(1, &p.x[i], &p.y[i], 1);
      if (j - i > 1) plline(static_cast<PLINT>(j - i), &p.x[i], &p.y[i]);
      i = j;
    }
    return;
  }
  std::vector<double> zx, zy;  // impulses: one zigzag line up and down each bar (one SVG path)
  for (std::size_t i = 0; i < n; ++i) {
    if (!finite(i)) continue;
    if (style == Style::Points) plpoin(1, &p.x[i], &p.y[i], 17);  // a filled circle (plssym)
    if (style != Style::Impulses) continue;
    zx.insert(zx.end(), {p.x[i], p.x[i], p.x[i]});
    zy.insert(zy.end(), {y_bottom, p.y[i], y_bottom});
  }
  if (!zx.empty()) plline(static_cast<PLINT>(zx.size()), zx.data(), zy.data());
}

void draw_legend(const Chart& chart, const std::vector<int>& colors) {
  std::vector<PLINT> opts, line_colors, line_styles, symbol_colors, symbol_numbers, text_colors;
  std::vector<PLFLT> line_widths, symbol_scales;
  std::vector<const char*> texts, symbols;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    if (s.label.empty()) continue;
    opts.push_back(s.style == Style::Points ? PL_LEGEND_SYMBOL : PL_LEGEND_LINE);
    line_colors.push_back(colors[i]);
    symbol_colors.push_back(colors[i]);
    text_colors.push_back(k_ink);
    line_styles.push_back(1);
    line_widths.push_back(2.0);
    symbol_scales.push_back(1.0);
    symbol_numbers.push_back(1);
    symbols.push_back("#(728)");  // a filled circle
    texts.push_back(s.label.c_str());
  }
  if (texts.empty()) return;
  PLFLT width = 0, height = 0;
  pllegend(&width, &height, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
           PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE, 0.02, 0.02, 0.06, k_background,
           k_ink, 1, 0, 0, static_cast<PLINT>(texts.size()), opts.data(), 1.0, 0.8, 2.0, 0.0,
           text_colors.data(), texts.data(), nullptr, nullptr, nullptr, nullptr, line_colors.data(),
           line_styles.data(), line_widths.data(), symbol_colors.data(), symbol_scales.data(),
           symbol_numbers.data(), symbols.data());
}

// A log axis labels its decades only; over less than two decades that is one or two numbers, so
// the ticks at 2 and 5 (and 3, under one decade) times a power of ten get labels too. `side`:
// "b" (x) or "l" (y), in PLplot's plmtex terms; lo, hi: the axis range in log10.
void label_log_axis(const char* side, double lo, double hi) {
  const double span = hi - lo;
  if (span >= 2) return;
  const std::vector<double> mantissas =
      span < 1 ? std::vector<double>{2, 3, 5} : std::vector<double>{2, 5};
  const bool y = side[0] == 'l';
  for (int k = static_cast<int>(std::floor(lo)); k <= static_cast<int>(std::ceil(hi)); ++k)
    for (double m : mantissas) {
      const double v = std::log10(m) + k;
      if (v <= lo || v >= hi) continue;
      const std::string text = fmt::format("{:g}", m * std::pow(10.0, k));
      plmtex(y ? "lv" : "b", y ? 0.7 : 1.9, (v - lo) / span, y ? 1.0 : 0.5, text.c_str());
    }
}

void draw_chart(const Chart& chart) {
  std::vector<Points> points;
  Range xr, yr;
  for (const Series& s : chart.series) {
    points.push_back(axis_points(chart, s));
    for (std::size_t i = 0; i < points.back().x.size(); ++i)
      if (std::isfinite(points.back().x[i]) && std::isfinite(points.back().y[i]))
        xr.add(points.back().x[i]), yr.add(points.back().y[i]);
  }
  const bool categories = !chart.x_categories.empty();
  const double n_categories = static_cast<double>(chart.x_categories.size());
  const auto [x0, x1] = categories ? std::pair{-0.5, n_categories - 0.5} : xr.padded();
  const auto [y0, y1] = yr.padded();
  pladv(0);
  plvsta();
  plwind(x0, x1, y0, y1);
  const std::string xopt = chart.log_x ? "lf" : "", yopt = chart.log_y ? "lf" : "";
  plcol0(k_grid);
  plwidth(0.5);
  plbox(("g" + xopt).c_str(), 0, 0, ("g" + yopt).c_str(), 0, 0);
  plcol0(k_ink);
  plwidth(1.0);
  plbox(categories ? "bc" : ("bcnst" + xopt).c_str(), 0, 0, ("bcnstv" + yopt).c_str(), 0, 0);
  for (std::size_t i = 0; i < chart.x_categories.size(); ++i)
    plmtex("b", 1.5, (static_cast<double>(i) - x0) / (x1 - x0), 0.5, chart.x_categories[i].c_str());
  if (chart.log_x) label_log_axis("b", x0, x1);
  if (chart.log_y) label_log_axis("l", y0, y1);
  pllab(chart.x_label.c_str(), "", chart.title.c_str());
  plmtex("l", 6.2, 0.5, 0.5, chart.y_label.c_str());  // clear of the horizontal tick numbers
  std::vector<int> colors;
  int next = 0;
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    const int index = k_first_series + static_cast<int>(i) % 200;
    const auto c = rgb(s.color.empty() ? k_palette[next++ % k_palette.size()] : s.color);
    plscol0(index, c[0], c[1], c[2]);
    colors.push_back(index);
    plcol0(index);
    plwidth(s.style == Style::Points ? 1.0 : s.style == Style::Line ? 2.0 : 1.5);
    plssym(0, 1.6);
    draw_series(points[i], s.style, y0);
  }
  plssym(0, 1.0);
  plwidth(1.0);
  draw_legend(chart, colors);
}

// PLplot retries a file it cannot open and then exits the process: the temporary file is
// created here first, so that a missing or read-only folder is an error line instead.
void check_writable(const fs::path& tmp, const fs::path& out) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    throw Error(fmt::format("cannot write {}: {}", out.string(), std::strerror(errno)),
                "check that its folder exists and is writable");
  std::fclose(f);
}

}  // namespace

void draw(const std::vector<Chart>& charts, const fs::path& out, const Page& page) {
  const char* device = device_for(out);
  if (charts.empty()) throw Error("nothing to draw", "give at least one chart");
  for (const Chart& chart : charts)  // bad input before PLplot starts
    for (const Series& s : chart.series)
      if (!s.color.empty()) rgb(s.color);
  require_device(device);
  fs::path tmp = out;
  tmp += fmt::format(".tmp.{}", ::getpid());
  check_writable(tmp, out);
  const int columns = std::max(1, page.columns);
  const int rows = (static_cast<int>(charts.size()) + columns - 1) / columns;
  PLINT previous = 0, stream = 0;
  plgstrm(&previous);
  plmkstrm(&stream);  // a stream of its own: draw() leaves the caller's PLplot state alone
  plsdev(device);
  plsfnam(tmp.c_str());
  plsetopt("geometry", fmt::format("{}x{}", page.width, page.height).c_str());
  plscmap0n(k_first_series + 200);
  plscol0(k_background, 255, 255, 255);
  plscol0(k_ink, 0, 0, 0);
  plscol0(k_grid, 220, 220, 220);
  plssub(columns, rows);
  plinit();
  plschr(0, columns * rows > 1 ? 0.7 : 0.9);  // characters scale with the panel
  for (const Chart& chart : charts) draw_chart(chart);
  plend1();
  plsstrm(previous);
  if (!fs::exists(tmp))
    throw Error(fmt::format("PLplot wrote no {}", out.string()),
                "check that the folder is writable");
  commit_temp_file(tmp, out);
}

void draw(const Chart& chart, const fs::path& out, const Page& page) {
  draw(std::vector<Chart>{chart}, out, page);
}

}  // namespace tessera::plot
