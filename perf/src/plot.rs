//! PNG charts of a [`SuiteReport`], for every suite alike: per group a bar chart of each
//! series' p50 and p99, and, for series placed on a numeric axis ([`Series::at_x`]), a line
//! chart of p50 (solid) and p99 (dashed) against that axis, one line per series name.
//!
//! Drawn with `plotters` on its bitmap backend with its `ab_glyph` text renderer: no system
//! font libraries. The font is a TrueType file read at run time ([`FONT_CANDIDATES`], or
//! `$SKIFF_PLOT_FONT`); without one the charts are skipped with a warning (the reports are
//! still written). Both axes switch to a log scale when the values span more than
//! [`LOG_SPREAD`]x.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Series, SuiteReport, fmt_ms};

/// Fonts tried in order (`fonts-dejavu-core` on Debian and Ubuntu provides the first).
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];
/// Environment variable naming a TrueType font to use instead.
pub const FONT_ENV: &str = "SKIFF_PLOT_FONT";
/// A max/min ratio above which an axis is logarithmic.
pub const LOG_SPREAD: f64 = 20.0;

const FAMILY: &str = "sans-serif";
const LEGEND_GREY: RGBColor = RGBColor(100, 100, 100);
const BAR_SIZE: (u32, u32) = (1000, 560);
const LINE_SIZE: (u32, u32) = (1000, 600);
/// One colour per series name, in order of first appearance in the report.
const PALETTE: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One chart written: its file name (next to the report) and title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plot {
    pub file: String,
    pub title: String,
}

/// Registers the font once; the path it came from, or `None` when there is none.
pub fn font() -> Option<&'static str> {
    static FONT: OnceLock<Option<String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let env = std::env::var(FONT_ENV).ok();
        let paths = env
            .iter()
            .map(String::as_str)
            .chain(FONT_CANDIDATES.iter().copied());
        for path in paths {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            // plotters keeps fonts for the life of the process: leak the one file, once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                return Some(path.to_string());
            }
            tracing::warn!(path, "not a usable TrueType font");
        }
        None
    })
    .as_deref()
}

/// Writes the charts of `report` as `<dir>/<stem>-<n>.png`; returns them in order. Without a
/// font it writes none and warns.
pub fn write_plots(report: &SuiteReport, dir: &Path, stem: &str) -> Result<Vec<Plot>> {
    if font().is_none() {
        tracing::warn!(
            candidates = ?FONT_CANDIDATES,
            "no TrueType font found (install fonts-dejavu-core or set {FONT_ENV}): no charts"
        );
        return Ok(Vec::new());
    }
    let colors = colors(&report.series);
    let mut plots = Vec::new();
    let mut next = |title: String| {
        let file = format!("{stem}-{}.png", plots.len() + 1);
        plots.push(Plot {
            file: file.clone(),
            title,
        });
        dir.join(file)
    };
    for group in report.groups() {
        let series: Vec<&Series> = report.series.iter().filter(|s| s.group == group).collect();
        let title = match &group {
            Some(g) => format!("{}: {g}", report.suite),
            None => format!("{}: {}", report.suite, report.title),
        };
        let path = next(title.clone());
        bar_chart(&path, &title, &series, &colors)?;
    }
    for chart in line_charts(&report.series) {
        let title = format!("{}: {} vs {}", report.suite, chart.name, chart.axis);
        let path = next(title.clone());
        line_chart(&path, &title, &chart, &colors)?;
    }
    Ok(plots)
}

fn colors(series: &[Series]) -> BTreeMap<String, RGBColor> {
    let mut out = BTreeMap::new();
    for s in series {
        let n = out.len();
        out.entry(s.name.clone())
            .or_insert(PALETTE[n % PALETTE.len()]);
    }
    out
}

fn lighter(c: RGBColor) -> RGBColor {
    let mix = |v: u8| ((u16::from(v) + 2 * 255) / 3) as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

fn draw_err<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow!("drawing {}: {e}", path.display())
}

/// A value axis: linear, or log10 of the values (so both are plain `f64` ranges), with
/// round tick values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Axis {
    pub log: bool,
    /// Drawn range (log10 when `log`).
    pub lo: f64,
    pub hi: f64,
    /// Ticks, in drawn units.
    pub ticks: Vec<f64>,
}

impl Axis {
    /// An axis showing `values` (all finite); from 0 when linear and `from_zero`.
    pub(crate) fn fit(values: &[f64], from_zero: bool) -> Axis {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !min.is_finite() || !max.is_finite() {
            return Axis::linear(0.0, 1.0);
        }
        if min > 0.0 && max / min > LOG_SPREAD {
            let lo = min.log10().floor();
            let hi = max.log10().ceil().max(lo + 1.0);
            let mut ticks = Vec::new();
            let mut d = lo;
            while d <= hi + 1e-9 {
                ticks.push(d);
                if hi - lo <= 3.0 {
                    for m in [2f64, 5.0] {
                        if d + m.log10() < hi {
                            ticks.push(d + m.log10());
                        }
                    }
                }
                d += 1.0;
            }
            return Axis {
                log: true,
                lo,
                hi,
                ticks,
            };
        }
        let lo = if from_zero { 0.0 } else { min.min(0.0) };
        let hi = if max > lo { max * 1.1 } else { lo + 1.0 };
        Axis::linear(lo, hi)
    }

    fn linear(lo: f64, hi: f64) -> Axis {
        let raw = (hi - lo) / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        let mut ticks = Vec::new();
        let mut t = (lo / step).ceil() * step;
        while t <= hi + 1e-9 && ticks.len() < 50 {
            ticks.push(t);
            t += step;
        }
        Axis {
            log: false,
            lo,
            hi,
            ticks,
        }
    }

    /// The plotters coordinate from `lo` to `hi` (drawn units) with this axis' ticks.
    fn coord(&self, lo: f64, hi: f64) -> Ticked {
        Ticked {
            lo,
            hi,
            ticks: self.ticks.clone(),
        }
    }

    /// A value in drawn units.
    pub(crate) fn at(&self, v: f64) -> f64 {
        if self.log {
            v.max(10f64.powf(self.lo)).log10()
        } else {
            v
        }
    }

    /// The value of a drawn position.
    pub(crate) fn value(&self, drawn: f64) -> f64 {
        if self.log { 10f64.powf(drawn) } else { drawn }
    }
}

/// A linear `f64` coordinate whose ticks are exactly the given ones (plotters' own
/// `with_key_points` loses the default label formatting).
struct Ticked {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        if self.hi == self.lo {
            return (limit.0 + limit.1) / 2;
        }
        let share = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (f64::from(limit.1 - limit.0) * share + 1e-3).floor() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.max_num_points() == 0 {
            return Vec::new();
        }
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// A tick value without trailing zeros: `0.5`, `2`, `10`, `0.02`.
pub(crate) fn fmt_tick(v: f64) -> String {
    let s = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `1`, `2.5`, `10k`, `50k`, `1.5M`: a count on an axis.
pub(crate) fn fmt_count(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(format!("{:.1}", v / 1e6)))
    } else if a >= 1e3 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else {
        trim(format!("{v:.2}"))
    }
}

fn bar_chart(
    path: &Path,
    title: &str,
    series: &[&Series],
    colors: &BTreeMap<String, RGBColor>,
) -> Result<()> {
    let values: Vec<f64> = series
        .iter()
        .flat_map(|s| [s.summary.p50, s.summary.p99])
        .collect();
    let mut y = Axis::fit(&values, true);
    // Room above the tallest bar for its value label.
    let top = values.iter().copied().fold(0.0, f64::max);
    if y.log && top > 0.0 && y.hi - top.log10() < 0.2 {
        y.hi += 1.0;
        y.ticks.push(y.hi);
    }
    let n = series.len().max(1) as f64;
    let root = BitMapBackend::new(path, BAR_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(18)
        .x_label_area_size(64)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5..n - 0.5, y.coord(y.lo, y.hi))
        .map_err(draw_err(path))?;
    let y_fmt = |v: &f64| fmt_tick(y.value(*v));
    let y_desc = if y.log { "ms (log scale)" } else { "ms" };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&y_fmt)
        .y_desc(y_desc)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(draw_err(path))?;
    let base = y.lo;
    let value_style =
        TextStyle::from((FAMILY, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (i, s) in series.iter().enumerate() {
        let c = colors.get(&s.name).copied().unwrap_or(BLACK);
        let x = i as f64;
        for (off, v, fill) in [(-0.36, s.summary.p50, c), (0.02, s.summary.p99, lighter(c))] {
            let top = y.at(v).max(base);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x + off, base), (x + off + 0.34, top)],
                    fill.filled(),
                )))
                .map_err(draw_err(path))?;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x + off, base), (x + off + 0.34, top)],
                    c.stroke_width(1),
                )))
                .map_err(draw_err(path))?;
            let (px, py) = chart.backend_coord(&(x + off + 0.17, top));
            root.draw(&Text::new(fmt_ms(v), (px, py - 3), value_style.clone()))
                .map_err(draw_err(path))?;
        }
        let (px, py) = chart.backend_coord(&(x, base));
        let label =
            TextStyle::from((FAMILY, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(s.name.clone(), (px, py + 8), label))
            .map_err(draw_err(path))?;
    }
    // Legend, under the category names: which shade is which percentile.
    let legend = TextStyle::from((FAMILY, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let (lx, ly) = (BAR_SIZE.0 as i32 - 260, BAR_SIZE.1 as i32 - 22);
    for (k, (label, fill)) in [
        ("p50 (dark)", LEGEND_GREY),
        ("p99 (light)", lighter(LEGEND_GREY)),
    ]
    .into_iter()
    .enumerate()
    {
        let x = lx + 120 * k as i32;
        root.draw(&Rectangle::new(
            [(x, ly - 7), (x + 14, ly + 7)],
            fill.filled(),
        ))
        .map_err(draw_err(path))?;
        root.draw(&Text::new(label, (x + 19, ly), legend.clone()))
            .map_err(draw_err(path))?;
    }
    root.present().map_err(draw_err(path))?;
    Ok(())
}

/// One line of a [`LineChart`]: a series name and its `(x, p50, p99)` points, sorted by x.
pub(crate) type Line = (String, Vec<(f64, f64, f64)>);

/// One line chart: the series placed on one `(chart, axis)`.
#[derive(Debug, Clone)]
pub(crate) struct LineChart {
    pub name: String,
    pub axis: String,
    /// Per series name, in first-appearance order.
    pub lines: Vec<Line>,
}

/// The line charts of `series`: one per `(chart, axis)` of [`Series::x`] with at least two
/// distinct x values.
pub(crate) fn line_charts(series: &[Series]) -> Vec<LineChart> {
    let mut charts: Vec<LineChart> = Vec::new();
    for s in series {
        let Some(x) = &s.x else { continue };
        let i = match charts
            .iter()
            .position(|c| c.name == x.chart && c.axis == x.axis)
        {
            Some(i) => i,
            None => {
                charts.push(LineChart {
                    name: x.chart.clone(),
                    axis: x.axis.clone(),
                    lines: Vec::new(),
                });
                charts.len() - 1
            }
        };
        let lines = &mut charts[i].lines;
        let j = match lines.iter().position(|(n, _)| *n == s.name) {
            Some(j) => j,
            None => {
                lines.push((s.name.clone(), Vec::new()));
                lines.len() - 1
            }
        };
        lines[j].1.push((x.value, s.summary.p50, s.summary.p99));
    }
    for c in &mut charts {
        for (_, points) in &mut c.lines {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    charts.retain(|c| {
        let mut xs: Vec<f64> = c
            .lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.0))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.len() >= 2
    });
    charts
}

fn line_chart(
    path: &Path,
    title: &str,
    chart_data: &LineChart,
    colors: &BTreeMap<String, RGBColor>,
) -> Result<()> {
    let points = chart_data.lines.iter().flat_map(|(_, p)| p.iter());
    let xs: Vec<f64> = points.clone().map(|p| p.0).collect();
    let ys: Vec<f64> = points.flat_map(|p| [p.1, p.2]).collect();
    let x = Axis::fit(&xs, false);
    let y = Axis::fit(&ys, true);
    // A little room left and right of the outermost points.
    let pad = (x.hi - x.lo) * 0.04;
    let (x_lo, x_hi) = if x.log {
        (
            x.at(xs.iter().copied().fold(f64::INFINITY, f64::min)) - pad,
            x.hi,
        )
    } else {
        (x.lo - pad, x.hi)
    };
    let root = BitMapBackend::new(path, LINE_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(18)
        .x_label_area_size(52)
        .y_label_area_size(80)
        .build_cartesian_2d(x.coord(x_lo, x_hi), y.coord(y.lo, y.hi))
        .map_err(draw_err(path))?;
    let x_fmt = |v: &f64| fmt_count(x.value(*v));
    let y_fmt = |v: &f64| fmt_tick(y.value(*v));
    let x_desc = format!(
        "{}{}",
        chart_data.axis,
        if x.log { " (log scale)" } else { "" }
    );
    let y_desc = format!(
        "ms, p50 solid, p99 dashed{}",
        if y.log { " (log scale)" } else { "" }
    );
    chart
        .configure_mesh()
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(draw_err(path))?;
    for (name, pts) in &chart_data.lines {
        let c = colors.get(name).copied().unwrap_or(BLACK);
        let p50: Vec<(f64, f64)> = pts.iter().map(|p| (x.at(p.0), y.at(p.1))).collect();
        let p99: Vec<(f64, f64)> = pts.iter().map(|p| (x.at(p.0), y.at(p.2))).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), c.stroke_width(3)))
            .map_err(draw_err(path))?
            .label(name.clone())
            .legend(move |(lx, ly)| {
                PathElement::new(vec![(lx, ly), (lx + 24, ly)], c.stroke_width(3))
            });
        chart
            .draw_series(p50.iter().map(|p| Circle::new(*p, 4, c.filled())))
            .map_err(draw_err(path))?;
        chart
            .draw_series(DashedLineSeries::new(p99.clone(), 8, 5, c.stroke_width(2)))
            .map_err(draw_err(path))?;
        chart
            .draw_series(p99.iter().map(|p| Circle::new(*p, 3, c.stroke_width(2))))
            .map_err(draw_err(path))?;
    }
    // The legend goes to the corner with the fewest points under it.
    let norm: Vec<(f64, f64)> = chart_data
        .lines
        .iter()
        .flat_map(|(_, p)| p.iter())
        .flat_map(|p| [(p.0, p.1), (p.0, p.2)])
        .map(|(px, py)| {
            (
                (x.at(px) - x_lo) / (x_hi - x_lo),
                (y.at(py) - y.lo) / (y.hi - y.lo),
            )
        })
        .collect();
    let corner = legend_corner(&norm);
    chart
        .configure_series_labels()
        .position(corner)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FAMILY, 15))
        .draw()
        .map_err(draw_err(path))?;
    root.present().map_err(draw_err(path))?;
    Ok(())
}

/// The corner of the plot (points normalised to 0..1, y up) whose legend-sized box, a third
/// of the width and a third of the height, covers the fewest points; upper corners first.
fn legend_corner(points: &[(f64, f64)]) -> SeriesLabelPosition {
    let count = |left: bool, upper: bool| {
        points
            .iter()
            .filter(|(x, y)| {
                let in_x = if left { *x <= 0.36 } else { *x >= 0.64 };
                let in_y = if upper { *y >= 0.64 } else { *y <= 0.36 };
                in_x && in_y
            })
            .count()
    };
    let corners = [
        (true, true, SeriesLabelPosition::UpperLeft),
        (false, true, SeriesLabelPosition::UpperRight),
        (true, false, SeriesLabelPosition::LowerLeft),
        (false, false, SeriesLabelPosition::LowerRight),
    ];
    corners
        .into_iter()
        .min_by_key(|(l, u, _)| count(*l, *u))
        .map(|(_, _, c)| c)
        .unwrap_or(SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_avoids_the_points() {
        let pos = |p: &[(f64, f64)]| format!("{:?}", legend_corner(p));
        assert_eq!(pos(&[]), "UpperLeft");
        assert_eq!(pos(&[(0.1, 0.9)]), "UpperRight");
        assert_eq!(pos(&[(0.1, 0.9), (0.9, 0.9)]), "LowerLeft");
    }

    #[test]
    fn linear_axis_has_round_ticks_from_zero() {
        let a = Axis::fit(&[3.0, 7.5], true);
        assert!(!a.log);
        assert_eq!(a.lo, 0.0);
        assert!(a.hi >= 7.5);
        assert_eq!(a.ticks[0], 0.0);
        let step = a.ticks[1] - a.ticks[0];
        assert!([1.0, 2.0, 5.0].contains(&step), "{a:?}");
    }

    #[test]
    fn wide_spread_gives_a_log_axis_in_decades() {
        let a = Axis::fit(&[0.05, 120.0], true);
        assert!(a.log);
        assert_eq!((a.lo, a.hi), (-2.0, 3.0));
        assert_eq!(a.ticks, vec![-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]);
        assert!((a.value(a.at(120.0)) - 120.0).abs() < 1e-9);
        // Narrower log ranges get 2x and 5x ticks too.
        let b = Axis::fit(&[1.0, 50_000.0], false);
        assert!(b.log);
        assert_eq!(b.ticks.first(), Some(&0.0));
        assert_eq!(b.ticks.last(), Some(&5.0));
    }

    #[test]
    fn counts_are_short() {
        assert_eq!(fmt_count(1.0), "1");
        assert_eq!(fmt_count(100.0), "100");
        assert_eq!(fmt_count(1000.0), "1k");
        assert_eq!(fmt_count(10_000.0), "10k");
        assert_eq!(fmt_count(2500.0), "2.5k");
        assert_eq!(fmt_count(1_500_000.0), "1.5M");
        assert_eq!(fmt_count(0.5), "0.5");
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_tick(10.0), "10");
        assert_eq!(fmt_tick(0.02), "0.02");
        assert_eq!(fmt_tick(2000.0), "2000");
    }
}
