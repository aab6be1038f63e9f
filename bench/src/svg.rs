//! Charts for the `--report` document, as standalone SVG files (no script, no external font
//! or style: they render the same in a browser, on GitHub and in an editor's preview).
//!
//! One kind of chart serves every figure: categories along x (stream counts, client counts,
//! store sizes), one series per system, drawn as lines (throughput against load) or grouped
//! bars (latency percentiles), on a linear or a log10 y axis. Every point carries a `<title>`
//! with its exact value, and every chart a caption saying the machine, the date and the
//! command it came from.

use std::fmt::Write as _;

/// How values map to height.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// log10; for values spanning decades (latencies from µs to seconds).
    Log,
}

/// How series are drawn.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lines,
    Bars,
}

/// What the y values are, for tick labels.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A rate or a count: 12k, 1.5M.
    Count,
    /// Microseconds: 50 µs, 2 ms, 1.2 s.
    Micros,
}

pub struct Series {
    pub name: String,
    /// One value per category; `None` where it was not measured.
    pub values: Vec<Option<f64>>,
    pub color: &'static str,
    /// A reference (a floor), drawn dashed.
    pub dashed: bool,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<Series>,
    pub scale: Scale,
    pub kind: Kind,
    pub unit: Unit,
    /// Machine, date and command, under the chart.
    pub caption: Vec<String>,
}

const W: f64 = 820.0;
const PLOT_X0: f64 = 84.0;
const PLOT_X1: f64 = 560.0;
const PLOT_Y0: f64 = 52.0;
const PLOT_Y1: f64 = 332.0;
const LEGEND_X: f64 = 578.0;

/// Colors, one per kind of system, so a system looks the same in every chart.
pub const HOLDFAST: &str = "#1f5fa8";
pub const HOLDFAST_ALT: &str = "#3fa7c4";
pub const HOLDFAST_NOOP: &str = "#9bbbd9";
pub const REDIS: &str = "#c23b22";
pub const SQLITE: &str = "#2e8b57";
pub const POSTGRES: &str = "#7b4fa0";
pub const FLOOR: &str = "#6b6b6b";
pub const EXTRA: &str = "#d08a1c";
pub const CEILING: &str = "#222222";
pub const CEILING_WORK: &str = "#8c6d31";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A y value as a tick or tooltip label.
pub fn label(v: f64, unit: Unit) -> String {
    let trim = |x: f64, suffix: &str| {
        let s = if x >= 100.0 || (x - x.round()).abs() < 1e-9 {
            format!("{x:.0}")
        } else if x >= 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        };
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        };
        format!("{s}{suffix}")
    };
    match unit {
        Unit::Count if v >= 1e6 => trim(v / 1e6, "M"),
        Unit::Count if v >= 1e3 => trim(v / 1e3, "k"),
        Unit::Count => trim(v, ""),
        Unit::Micros if v >= 1e6 => trim(v / 1e6, " s"),
        Unit::Micros if v >= 1e3 => trim(v / 1e3, " ms"),
        Unit::Micros => trim(v, " µs"),
    }
}

/// A round step near `raw`: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// The y axis: (value → y pixel, ticks as (value, major)).
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    ticks: Vec<(f64, bool)>,
}

impl Axis {
    fn new(values: &[f64], scale: Scale) -> Axis {
        let max = values.iter().copied().fold(0.0_f64, f64::max);
        match scale {
            Scale::Linear => {
                let step = nice_step((max / 5.0).max(1e-9));
                let hi = (max / step).ceil().max(1.0) * step;
                let n = (hi / step).round() as usize;
                Axis {
                    scale,
                    lo: 0.0,
                    hi,
                    ticks: (0..=n).map(|i| (i as f64 * step, true)).collect(),
                }
            }
            Scale::Log => {
                let min = values
                    .iter()
                    .copied()
                    .filter(|v| *v > 0.0)
                    .fold(f64::INFINITY, f64::min);
                let (min, max) = if min.is_finite() {
                    (min, max)
                } else {
                    (1.0, 10.0)
                };
                let lo = min.log10().floor();
                let hi = max.log10().ceil().max(lo + 1.0);
                let mut ticks = Vec::new();
                let mut d = lo;
                while d <= hi + 1e-9 {
                    let base = 10f64.powf(d);
                    ticks.push((base, true));
                    if d < hi - 1e-9 {
                        ticks.push((base * 2.0, false));
                        ticks.push((base * 5.0, false));
                    }
                    d += 1.0;
                }
                Axis {
                    scale,
                    lo: 10f64.powf(lo),
                    hi: 10f64.powf(hi),
                    ticks,
                }
            }
        }
    }

    fn y(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log => {
                (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
            }
        };
        PLOT_Y1 - f.clamp(0.0, 1.0) * (PLOT_Y1 - PLOT_Y0)
    }
}

/// Split `s` into lines of at most `width` characters at spaces.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in s.split(' ') {
        let cur = lines.last_mut().map_or(0, |l| l.chars().count());
        if cur > 0 && cur + 1 + word.chars().count() > width {
            lines.push(String::new());
        }
        if let Some(l) = lines.last_mut() {
            if !l.is_empty() {
                l.push(' ');
            }
            l.push_str(word);
        }
    }
    lines
}

impl Chart {
    /// The chart as an SVG document.
    pub fn render(&self) -> String {
        let values: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
            .filter(|v| v.is_finite())
            .collect();
        let axis = Axis::new(&values, self.scale);
        let caption: Vec<String> = self.caption.iter().flat_map(|c| wrap(c, 128)).collect();
        let n = self.categories.len().max(1) as f64;
        let gw = (PLOT_X1 - PLOT_X0) / n;
        // Category labels wrap to their group's width (~6.5 px a character); the x label and
        // the caption move down by the extra lines.
        let per_line = ((gw / 6.5) as usize).max(6);
        let below = self
            .categories
            .iter()
            .map(|c| wrap(c, per_line).len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1) as f64
            * 14.0;
        let legend_rows: Vec<Vec<String>> = self.series.iter().map(|s| wrap(&s.name, 30)).collect();
        let legend_h: f64 = legend_rows
            .iter()
            .map(|r| r.len() as f64 * 15.0 + 6.0)
            .sum();
        let h =
            (PLOT_Y1 + 58.0 + below + caption.len() as f64 * 14.0).max(PLOT_Y0 + legend_h + 20.0);
        let mut o = String::new();
        let _ = write!(
            o,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="Helvetica, Arial, sans-serif" font-size="12">
<title>{t}</title>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{x}" y="24" font-size="15" font-weight="bold" fill="#222">{t}</text>
"##,
            x = PLOT_X0,
            t = esc(&self.title)
        );
        // Grid and y ticks.
        for (v, major) in &axis.ticks {
            let y = axis.y(*v);
            let _ = writeln!(
                o,
                r##"<line x1="{PLOT_X0}" x2="{PLOT_X1}" y1="{y:.1}" y2="{y:.1}" stroke="{}" stroke-width="1"/>"##,
                if *major { "#d8d8d8" } else { "#efefef" }
            );
            if *major || self.scale == Scale::Log {
                let _ = writeln!(
                    o,
                    r##"<text x="{}" y="{:.1}" text-anchor="end" fill="{}">{}</text>"##,
                    PLOT_X0 - 6.0,
                    y + 4.0,
                    if *major { "#444" } else { "#999" },
                    esc(&label(*v, self.unit))
                );
            }
        }
        let _ = writeln!(
            o,
            r##"<line x1="{PLOT_X0}" x2="{PLOT_X0}" y1="{PLOT_Y0}" y2="{PLOT_Y1}" stroke="#888"/>
<line x1="{PLOT_X0}" x2="{PLOT_X1}" y1="{PLOT_Y1}" y2="{PLOT_Y1}" stroke="#888"/>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle" fill="#333">{}</text>
<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            (PLOT_Y0 + PLOT_Y1) / 2.0,
            esc(&self.y_label),
            (PLOT_X0 + PLOT_X1) / 2.0,
            PLOT_Y1 + 36.0 + below,
            esc(&self.x_label)
        );
        let cx = |i: usize| PLOT_X0 + gw * (i as f64 + 0.5);
        // Category labels, wrapped to their group's width.
        for (i, c) in self.categories.iter().enumerate() {
            for (j, line) in wrap(c, per_line).iter().enumerate() {
                let _ = writeln!(
                    o,
                    r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
                    cx(i),
                    PLOT_Y1 + 16.0 + j as f64 * 14.0,
                    esc(line)
                );
            }
        }

        match self.kind {
            Kind::Bars => {
                let ns = self.series.len().max(1) as f64;
                let bw = gw * 0.8 / ns;
                for (k, s) in self.series.iter().enumerate() {
                    for (i, v) in s.values.iter().enumerate() {
                        let Some(v) = v.filter(|v| v.is_finite()) else {
                            continue;
                        };
                        let x = cx(i) - gw * 0.4 + bw * k as f64;
                        let y = axis.y(v);
                        let _ = writeln!(
                            o,
                            r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"{}><title>{}, {}: {}</title></rect>"##,
                            (bw - 1.0).max(1.0),
                            (PLOT_Y1 - y).max(0.5),
                            s.color,
                            if s.dashed {
                                r#" fill-opacity="0.45""#
                            } else {
                                ""
                            },
                            esc(&s.name),
                            esc(&self.categories[i]),
                            esc(&label(v, self.unit))
                        );
                    }
                }
            }
            Kind::Lines => {
                for s in &self.series {
                    let pts: Vec<(f64, f64, f64, usize)> = s
                        .values
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| {
                            v.filter(|v| v.is_finite())
                                .map(|v| (cx(i), axis.y(v), v, i))
                        })
                        .collect();
                    let path: Vec<String> = pts
                        .iter()
                        .map(|(x, y, ..)| format!("{x:.1},{y:.1}"))
                        .collect();
                    if pts.len() > 1 {
                        let _ = writeln!(
                            o,
                            r##"<polyline points="{}" fill="none" stroke="{}" stroke-width="2.2"{}/>"##,
                            path.join(" "),
                            s.color,
                            if s.dashed {
                                r#" stroke-dasharray="6 4""#
                            } else {
                                ""
                            }
                        );
                    }
                    for (x, y, v, i) in pts {
                        let _ = writeln!(
                            o,
                            r##"<circle cx="{x:.1}" cy="{y:.1}" r="3.6" fill="{}"><title>{}, {}: {}</title></circle>"##,
                            s.color,
                            esc(&s.name),
                            esc(&self.categories[i]),
                            esc(&label(v, self.unit))
                        );
                    }
                }
            }
        }
        // Legend.
        let mut y = PLOT_Y0 + 4.0;
        for (s, rows) in self.series.iter().zip(&legend_rows) {
            let mark = match (self.kind, s.dashed) {
                (Kind::Lines, dashed) => format!(
                    r##"<line x1="{LEGEND_X}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{}" stroke-width="2.5"{}/>"##,
                    LEGEND_X + 22.0,
                    s.color,
                    if dashed {
                        r#" stroke-dasharray="6 4""#
                    } else {
                        ""
                    }
                ),
                (Kind::Bars, dashed) => format!(
                    r##"<rect x="{LEGEND_X}" y="{:.1}" width="22" height="10" fill="{}"{}/>"##,
                    y - 5.0,
                    s.color,
                    if dashed {
                        r#" fill-opacity="0.45""#
                    } else {
                        ""
                    }
                ),
            };
            let _ = writeln!(o, "{mark}");
            for (j, r) in rows.iter().enumerate() {
                let _ = writeln!(
                    o,
                    r##"<text x="{}" y="{:.1}" fill="#222">{}</text>"##,
                    LEGEND_X + 28.0,
                    y + 4.0 + j as f64 * 15.0,
                    esc(r)
                );
            }
            y += rows.len() as f64 * 15.0 + 6.0;
        }
        // Caption: machine, date, command.
        for (j, c) in caption.iter().enumerate() {
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{:.1}" font-size="10.5" fill="#666">{}</text>"##,
                12.0,
                PLOT_Y1 + 60.0 + below + j as f64 * 14.0,
                esc(c)
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_as_people_write_them() {
        assert_eq!(label(0.0, Unit::Count), "0");
        assert_eq!(label(2500.0, Unit::Count), "2.5k");
        assert_eq!(label(40_000.0, Unit::Count), "40k");
        assert_eq!(label(1_500_000.0, Unit::Count), "1.5M");
        assert_eq!(label(50.0, Unit::Micros), "50 µs");
        assert_eq!(label(2000.0, Unit::Micros), "2 ms");
        assert_eq!(label(12_500.0, Unit::Micros), "12.5 ms");
        assert_eq!(label(1_200_000.0, Unit::Micros), "1.2 s");
    }

    #[test]
    fn axes_cover_every_value_with_round_ticks() {
        let a = Axis::new(&[3.0, 38_245.0], Scale::Linear);
        assert_eq!(a.lo, 0.0);
        assert!(a.hi >= 38_245.0 && a.hi <= 50_000.0, "{}", a.hi);
        assert!(a
            .ticks
            .iter()
            .all(|(v, _)| (v / 10_000.0).fract().abs() < 1e-9));
        let l = Axis::new(&[17.0, 2_139_370.0], Scale::Log);
        assert_eq!((l.lo, l.hi), (10.0, 10_000_000.0));
        assert!(l.y(17.0) < PLOT_Y1 && l.y(2_139_370.0) > PLOT_Y0);
        assert!(l.y(100.0) > l.y(1000.0), "higher values are higher up");
    }

    #[test]
    fn a_chart_is_well_formed_and_escapes_its_text() {
        let c = Chart {
            title: "a <b> & \"c\"".into(),
            x_label: "streams".into(),
            y_label: "per s".into(),
            categories: vec!["1".into(), "16".into()],
            series: vec![
                Series {
                    name: "holdfast".into(),
                    values: vec![Some(10.0), None],
                    color: HOLDFAST,
                    dashed: false,
                },
                Series {
                    name: "floor".into(),
                    values: vec![Some(20.0), Some(20.0)],
                    color: FLOOR,
                    dashed: true,
                },
            ],
            scale: Scale::Linear,
            kind: Kind::Lines,
            unit: Unit::Count,
            caption: vec!["machine · date · command".into()],
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt; &amp; &quot;c&quot;"));
        assert!(!svg.contains("<b>"));
        // One point for holdfast (its second value is missing), two and a line for the floor.
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(svg.contains("stroke-dasharray"));
        let bars = Chart {
            kind: Kind::Bars,
            scale: Scale::Log,
            ..c
        }
        .render();
        assert_eq!(
            bars.matches("<rect x=").count(),
            3 + 2,
            "3 bars + 2 legend swatches"
        );
    }
}
