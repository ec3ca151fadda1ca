// simulation_svg: a hand-written SVG line chart (no plotting library): log2 ranks on x, log10
// seconds on y, one polyline per strategy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <sstream>

#include "seqpar/plan/simulate.h"

namespace seqpar {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string time_label(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%g s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%g ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%g us", s * 1e6);
  return buf;
}

// The colour of the i-th curve (red marks where communication stops hiding).
const char* color_of(size_t i) {
  static constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                             "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  return kPalette[i % std::size(kPalette)];
}

}  // namespace

std::string simulation_svg(const Simulation& sim, const std::string& title) {
  const double W = 900, Hh = 540, left = 90, right = 230, top = 60, bottom = 70;
  const double pw = W - left - right, ph = Hh - top - bottom;
  double tmin = INFINITY, tmax = 0;
  for (const auto& c : sim.curves)
    for (const auto& p : c.points)
      if (p.valid && p.step_s > 0) {
        tmin = std::min(tmin, p.step_s);
        tmax = std::max(tmax, p.step_s);
        const double compute =
            p.compute_s * (p.step_s / std::max(p.compute_s + p.exposed_s, 1e-300));
        if (compute > 0) tmin = std::min(tmin, compute);
      }
  if (!(tmax > 0)) tmin = 1e-3, tmax = 1;
  const double y0 = std::floor(std::log10(tmin)),
               y1 = std::max(y0 + 1, std::ceil(std::log10(tmax)));
  const int nmin = sim.sizes.empty() ? 1 : sim.sizes.front();
  const int nmax = sim.sizes.empty() ? 2 : std::max(sim.sizes.back(), nmin * 2);
  const double x0 = std::log2(nmin), x1 = std::log2(nmax);
  auto X = [&](double ranks) { return left + (std::log2(ranks) - x0) / (x1 - x0) * pw; };
  auto Y = [&](double s) { return top + (1 - (std::log10(s) - y0) / (y1 - y0)) * ph; };

  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << Hh
    << "\" viewBox=\"0 0 " << W << " " << Hh << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << Hh << "\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
    << escape(title) << "</text>\n";
  // Grid and axes.
  for (int n : sim.sizes) {
    o << "<line x1=\"" << X(n) << "\" y1=\"" << top << "\" x2=\"" << X(n) << "\" y2=\"" << top + ph
      << "\" stroke=\"#e0e0e0\"/>\n"
      << "<text x=\"" << X(n) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">" << n
      << "</text>\n";
  }
  for (double d = y0; d <= y1 + 1e-9; d += 1) {
    const double s = std::pow(10.0, d);
    o << "<line x1=\"" << left << "\" y1=\"" << Y(s) << "\" x2=\"" << left + pw << "\" y2=\""
      << Y(s) << "\" stroke=\"#e0e0e0\"/>\n"
      << "<text x=\"" << left - 8 << "\" y=\"" << Y(s) + 4 << "\" text-anchor=\"end\">"
      << escape(time_label(s)) << "</text>\n";
  }
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << left + pw / 2 << "\" y=\"" << Hh - 25
    << "\" text-anchor=\"middle\">sequence-parallel ranks</text>\n"
    << "<text x=\"22\" y=\"" << top + ph / 2
    << "\" text-anchor=\"middle\" transform=\"rotate(-90 22 " << top + ph / 2
    << ")\">predicted step time</text>\n";
  // Node boundary.
  if (sim.ranks_per_node > 0 && sim.ranks_per_node >= nmin && sim.ranks_per_node < nmax) {
    const double xb = X(sim.ranks_per_node + 0.5 * sim.ranks_per_node);
    o << "<line x1=\"" << xb << "\" y1=\"" << top << "\" x2=\"" << xb << "\" y2=\"" << top + ph
      << "\" stroke=\"#555\" stroke-dasharray=\"6,4\"/>\n"
      << "<text x=\"" << xb + 4 << "\" y=\"" << top + 14 << "\" fill=\"#555\">beyond one node ("
      << sim.ranks_per_node << " ranks)</text>\n";
  }
  // Curves: step time (solid), compute of the critical rank (dashed, same color).
  int legend = 0;
  for (size_t i = 0; i < sim.curves.size(); ++i) {
    const SimCurve& c = sim.curves[i];
    const char* col = color_of(i);
    std::ostringstream step, comp;
    step.setf(std::ios::fixed);
    comp.setf(std::ios::fixed);
    step.precision(1);
    comp.precision(1);
    bool any = false;
    for (const auto& p : c.points) {
      if (!p.valid || p.step_s <= 0) continue;
      any = true;
      step << X(p.ranks) << "," << Y(p.step_s) << " ";
      const double layers =
          p.compute_s + p.exposed_s > 0 ? p.step_s / (p.compute_s + p.exposed_s) : 1;
      comp << X(p.ranks) << "," << Y(std::max(p.compute_s * layers, std::pow(10.0, y0))) << " ";
    }
    if (!any) continue;
    o << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2.5\" points=\""
      << step.str() << "\"/>\n"
      << "<polyline fill=\"none\" stroke=\"" << col
      << "\" stroke-width=\"1\" stroke-dasharray=\"3,3\" points=\"" << comp.str() << "\"/>\n";
    for (const auto& p : c.points) {
      if (!p.valid || p.step_s <= 0) continue;
      o << "<circle cx=\"" << X(p.ranks) << "\" cy=\"" << Y(p.step_s) << "\" r=\"3.5\" fill=\""
        << col << "\"><title>" << escape(std::string(strategy_name(c.strategy))) << " " << p.ranks
        << " ranks: " << escape(time_label(p.step_s)) << ", exposed comm "
        << static_cast<int>(100 * p.exposed_fraction + 0.5) << "%</title></circle>\n";
      if (p.ranks == c.stops_hiding_at)
        o << "<circle cx=\"" << X(p.ranks) << "\" cy=\"" << Y(p.step_s)
          << "\" r=\"8\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>\n";
    }
    const double ly = top + 10 + 22 * legend++;
    o << "<line x1=\"" << left + pw + 15 << "\" y1=\"" << ly << "\" x2=\"" << left + pw + 45
      << "\" y2=\"" << ly << "\" stroke=\"" << col << "\" stroke-width=\"2.5\"/>\n"
      << "<text x=\"" << left + pw + 52 << "\" y=\"" << ly + 4 << "\">"
      << escape(std::string(strategy_name(c.strategy))) << "</text>\n";
  }
  const double ly = top + 10 + 22 * legend;
  o << "<line x1=\"" << left + pw + 15 << "\" y1=\"" << ly << "\" x2=\"" << left + pw + 45
    << "\" y2=\"" << ly << "\" stroke=\"#333\" stroke-dasharray=\"3,3\"/>\n"
    << "<text x=\"" << left + pw + 52 << "\" y=\"" << ly + 4 << "\">compute only</text>\n"
    << "<circle cx=\"" << left + pw + 30 << "\" cy=\"" << ly + 22
    << "\" r=\"8\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>\n"
    << "<text x=\"" << left + pw + 52 << "\" y=\"" << ly + 26 << "\">comm stops hiding</text>\n"
    << "<text x=\"" << left + pw + 15 << "\" y=\"" << ly + 56 << "\" fill=\"#555\">"
    << escape(sim.hardware) << ", " << escape(std::string(layout_name(sim.layout))) << "</text>\n"
    << "</svg>\n";
  return o.str();
}

}  // namespace seqpar
