// kizuna-bench --plot FILE.svg: bus bandwidth against message size, one solid line per series
// (an algorithm with --algo all, else the engine's choice, "auto"; the type and reduction join the
// name when the sweep has several), and the cost model's prediction for it as a dashed line of the
// same colour (busbw from the predicted time). The measurement is out of place, or in place when
// only that was run. Both axes are logarithmic, as algorithms' busbw differ by orders of magnitude:
// sizes by powers of two, busbw (GB/s) by decades (at most six, below the largest value).
//
// The SVG is written here as text: a static file of lines, axes and labels needs no plotting
// library, and none among Debian's C++ packages draws one without a display or a script
// interpreter (gnuplot and matplotlib are programs to run, not libraries to link).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/report.h"

namespace kizuna::bench {

// The plot of `rows` (rows of size 0 and rows with no measurement are left out); `title` is
// escaped. `busbw_factor` turns a predicted time into a predicted busbw, as for the measurements.
std::string PlotSvg(const std::vector<Row>& rows, double busbw_factor, std::string_view title);

}  // namespace kizuna::bench
