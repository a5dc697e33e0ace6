//! Throughput against threads (plotters): one panel per workload and mode,
//! one line per policy plus the host, each point the median of the repeats
//! with a bar from their min to their max. `interference` draws the
//! interfered runs solid and the runs alone dashed, in the same panel.
//!
//! Made to be read at a paper's column width: one column of panels (two
//! beyond three panels), text of 22-26 px on an 800 px wide panel, the
//! legend in a strip of its own under the panels (never over the data), a
//! caption naming the machine, the commit and the repeats, an Okabe-Ito
//! palette (distinguishable with the common colour-vision deficiencies)
//! with a marker shape per policy as well, and one y scale shared by every
//! panel whose operation is the same (the caption says where they differ).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{rows, Results};
use crate::stats::si;
use crate::workload::Workload;

/// One panel's size in pixels.
const PANEL: (u32, u32) = (800, 440);
/// Text sizes in pixels.
const TITLE: u32 = 26;
const LABEL: u32 = 24;
const TICK: u32 = 22;
const CAPTION: u32 = 20;

/// A TrueType/OpenType font under `/usr/share/fonts` (DejaVu Sans or
/// Liberation Sans preferred), leaked for plotters' `'static` registry.
fn find_font() -> Option<&'static [u8]> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("ttf") || x.eq_ignore_ascii_case("otf")) {
                out.push(p);
            }
        }
    }
    let mut fonts = Vec::new();
    walk(Path::new("/usr/share/fonts"), &mut fonts);
    fonts.sort();
    let rank = |p: &std::path::PathBuf| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match name.as_str() {
            "DejaVuSans.ttf" => 0,
            "LiberationSans-Regular.ttf" => 1,
            n if n.contains("Sans") && !n.contains("Bold") && !n.contains("Oblique") && !n.contains("Italic") => 2,
            _ => 3,
        }
    };
    fonts.sort_by_key(rank);
    fonts.iter().find_map(|p| {
        let bytes = std::fs::read(p).ok()?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).ok().map(|()| bytes)
    })
}

/// A policy's colour (Okabe & Ito's palette) and marker.
fn style(policy: &str) -> (RGBColor, Marker) {
    match policy {
        "host" => (RGBColor(0, 0, 0), Marker::Cross),
        "mmap-lock" | "locked" | "per-page" | "i-mmap-rwsem" | "one-by-one" => (RGBColor(213, 94, 0), Marker::Triangle),
        "speculative" | "sectioned" | "batched" => (RGBColor(230, 159, 0), Marker::Diamond),
        "per-vma" | "downgrade" | "vma-lock" => (RGBColor(86, 180, 233), Marker::Square),
        "per-vma-seq" | "lock-free" => (RGBColor(0, 114, 178), Marker::Circle),
        _ => (RGBColor(204, 121, 167), Marker::Circle),
    }
}

#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
}

/// Draws `marker` of `size` px centred on the backend pixel `(x, y)`.
fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    marker: Marker,
    color: RGBColor,
    size: i32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let fill = color.filled();
    match marker {
        Marker::Circle => area.draw(&Circle::new((x, y), size, fill)),
        Marker::Square => area.draw(&Rectangle::new([(x - size, y - size), (x + size, y + size)], fill)),
        Marker::Triangle => {
            area.draw(&Polygon::new(vec![(x, y - size - 1), (x - size - 1, y + size), (x + size + 1, y + size)], fill))
        }
        Marker::Diamond => {
            let s = size + 2;
            area.draw(&Polygon::new(vec![(x, y - s), (x + s, y), (x, y + s), (x - s, y)], fill))
        }
        Marker::Cross => {
            let st = color.stroke_width(3);
            area.draw(&PathElement::new(vec![(x - size, y - size), (x + size, y + size)], st))?;
            area.draw(&PathElement::new(vec![(x - size, y + size), (x + size, y - size)], st))
        }
    }
}

/// One line: `(threads, median, min, max)` points of one policy.
struct Series {
    policy: String,
    dashed: bool,
    points: Vec<(f64, f64, f64, f64)>,
}

struct Panel {
    title: String,
    y_label: String,
    series: Vec<Series>,
}

/// What a panel's y axis counts, per second.
fn y_label(workload: &str) -> String {
    match Workload::from_name(workload) {
        Some(Workload::Pft | Workload::PageFault1 | Workload::PageFault2 | Workload::PageFault3)
        | Some(Workload::Interference) => "page faults per second".into(),
        Some(Workload::Mmap1 | Workload::Mmap2) => "map+unmap pairs per second".into(),
        Some(Workload::TlbFlush) => "pages written and dropped per second".into(),
        Some(Workload::Cortenmm) => "16 KiB region operations per second".into(),
        _ => "operations per second".into(),
    }
}

fn panels<C>(results: &Results<C>) -> Vec<Panel> {
    let mut panels: Vec<Panel> = Vec::new();
    for row in rows(&results.samples) {
        let s = row.samples[0];
        let dashed = s.workload == "interference" && s.mode == "alone";
        let title = match s.workload.as_str() {
            "interference" => "interference: beside a mapping thread, and alone".to_string(),
            "pft" => "pft: each thread faults pages of its own region".to_string(),
            w => format!("{w} ({})", s.mode),
        };
        let panel = match panels.iter().position(|p| p.title == title) {
            Some(i) => &mut panels[i],
            None => {
                panels.push(Panel { title, y_label: y_label(&s.workload), series: Vec::new() });
                panels.last_mut().expect("pushed")
            }
        };
        let series = match panel.series.iter().position(|x| x.policy == s.policy && x.dashed == dashed) {
            Some(i) => &mut panel.series[i],
            None => {
                panel.series.push(Series { policy: s.policy.clone(), dashed, points: Vec::new() });
                panel.series.last_mut().expect("pushed")
            }
        };
        let (lo, hi) =
            row.samples.iter().fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(x.ops_per_sec), h.max(x.ops_per_sec)));
        series.points.push((s.threads as f64, row.median(), lo, hi));
    }
    for p in &mut panels {
        for s in &mut p.series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
    }
    panels
}

/// The caption, wrapped to `width` pixels: the machine, the commit, the
/// load, the repeats, the y scales.
fn caption<C>(results: &Results<C>, panels: &[Panel], width: u32) -> Vec<String> {
    let m = &results.machine;
    let repeats = results.samples.iter().map(|s| s.repeat + 1).max().unwrap_or(1);
    let load = m.load_start.map_or(String::new(), |l| format!(", load average {:.2} at the start", l[0]));
    let mut free: Vec<f64> = results.samples.iter().filter_map(|s| s.cpu.map(|c| c.free())).collect();
    free.sort_by(f64::total_cmp);
    let free = match (free.first(), free.last()) {
        (Some(lo), Some(hi)) => format!(
            " CPUs other processes left the samples: {lo:.2} to {hi:.2} of {}{}.",
            m.cores,
            if results.samples.iter().any(|s| s.cpu.is_some_and(|c| c.short())) {
                " (some well short of their threads: the table marks them)"
            } else {
                ""
            }
        ),
        _ => String::new(),
    };
    let shared = panels.windows(2).all(|w| w[0].y_label == w[1].y_label);
    let text = format!(
        "softmm {} on {} CPUs ({}), {}{load}.{free} Points: median of {repeats} repeat{}; bars: their min to \
         max. {}",
        m.softmm_commit,
        m.cores,
        m.model,
        m.kernel,
        if repeats == 1 { "" } else { "s" },
        if shared || panels.len() == 1 {
            "One y scale for every panel."
        } else {
            "Each panel has its own y scale: their operations differ."
        }
    );
    // About 0.48 em per character of a sans-serif font.
    let chars = ((width as f64 - 32.0) / (CAPTION as f64 * 0.48)) as usize;
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + word.len() > chars {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

fn draw<DB: DrawingBackend, C>(
    root: DrawingArea<DB, Shift>,
    results: &Results<C>,
    panels: &[Panel],
    text: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
    root.fill(&WHITE).map_err(e)?;
    let cols = if panels.len() > 3 { 2 } else { 1 };
    let nrows = panels.len().div_ceil(cols);
    let (legend_h, caption_h) = legend_caption_heights(results, panels, cols);
    let (width, height) = root.dim_in_pixel();
    let (body, rest) = root.split_vertically(height - legend_h - caption_h);
    let (legend, cap) = rest.split_vertically(legend_h);
    let shared = panels.windows(2).all(|w| w[0].y_label == w[1].y_label);
    let top = |p: &Panel| p.series.iter().flat_map(|s| s.points.iter().map(|q| q.3)).fold(0.0, f64::max);
    let shared_max = panels.iter().map(top).fold(1.0, f64::max);
    let areas = body.split_evenly((nrows, cols));
    for (panel, area) in panels.iter().zip(areas) {
        let xs: Vec<f64> = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let (xmin, xmax) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        let ymax = if shared { shared_max } else { top(panel).max(1.0) };
        let nx = (xmax - xmin) as usize + 1;
        let mut builder = ChartBuilder::on(&area);
        builder.margin(14).margin_right(28);
        if text {
            builder.caption(&panel.title, ("sans-serif", TITLE)).x_label_area_size(58).y_label_area_size(96);
        }
        let mut chart = builder.build_cartesian_2d(xmin - 0.25..xmax + 0.25, 0.0..ymax * 1.08).map_err(e)?;
        let mut mesh = chart.configure_mesh();
        mesh.light_line_style(WHITE).bold_line_style(BLACK.mix(0.12));
        if text {
            mesh.x_desc("threads")
                .y_desc(panel.y_label.as_str())
                .x_labels(nx.min(16))
                .y_labels(6)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| if *v == 0.0 { "0".into() } else { si(*v) })
                .label_style(("sans-serif", TICK))
                .axis_desc_style(("sans-serif", LABEL));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(e)?;
        // Offsets so that the min-max bars of the policies at one thread
        // count do not hide each other.
        let n = panel.series.iter().filter(|s| !s.dashed).count().max(1) as f64;
        let mut k = 0.0;
        for s in &panel.series {
            let (c, marker) = style(&s.policy);
            let line = ShapeStyle { color: c.to_rgba(), filled: false, stroke_width: 3 };
            let dx = if xmax > xmin { (k - (n - 1.0) / 2.0) * 0.035 * (xmax - xmin) } else { 0.0 };
            if !s.dashed {
                k += 1.0;
            }
            let pts: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0 + dx, p.1)).collect();
            if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 12, 8, line)).map_err(e)?;
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), line)).map_err(e)?;
            }
            let bar = c.stroke_width(2);
            for p in &s.points {
                let x = p.0 + dx;
                chart.draw_series(std::iter::once(PathElement::new(vec![(x, p.2), (x, p.3)], bar))).map_err(e)?;
            }
            let fill = c.filled();
            let at = |p: &(f64, f64)| EmptyElement::at(*p);
            match marker {
                Marker::Circle => chart.draw_series(pts.iter().map(|p| at(p) + Circle::new((0, 0), 6, fill))),
                Marker::Square => {
                    chart.draw_series(pts.iter().map(|p| at(p) + Rectangle::new([(-6, -6), (6, 6)], fill)))
                }
                Marker::Triangle => {
                    chart.draw_series(pts.iter().map(|p| at(p) + Polygon::new(vec![(0, -7), (-7, 6), (7, 6)], fill)))
                }
                Marker::Diamond => chart.draw_series(
                    pts.iter().map(|p| at(p) + Polygon::new(vec![(0, -8), (8, 0), (0, 8), (-8, 0)], fill)),
                ),
                Marker::Cross => chart.draw_series(pts.iter().map(|p| {
                    at(p)
                        + PathElement::new(vec![(-6, -6), (6, 6)], c.stroke_width(3))
                        + PathElement::new(vec![(-6, 6), (6, -6)], c.stroke_width(3))
                })),
            }
            .map_err(e)?;
        }
    }
    if text {
        draw_legend(&legend, panels).map_err(e)?;
        for (i, l) in caption(results, panels, width).iter().enumerate() {
            cap.draw(&Text::new(l.clone(), (16, 6 + i as i32 * (CAPTION as i32 + 6)), ("sans-serif", CAPTION)))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// The legend's entries: each policy once, in the panels' order, then the
/// line styles where a panel has dashed lines.
fn legend_entries(panels: &[Panel]) -> (Vec<String>, bool) {
    let mut names: Vec<String> = Vec::new();
    for p in panels {
        for s in &p.series {
            if !names.contains(&s.policy) {
                names.push(s.policy.clone());
            }
        }
    }
    (names, panels.iter().any(|p| p.series.iter().any(|s| s.dashed)))
}

const ENTRY_W: i32 = 250;
const ENTRY_H: i32 = 36;

fn legend_caption_heights<C>(results: &Results<C>, panels: &[Panel], cols: usize) -> (u32, u32) {
    let (names, styles) = legend_entries(panels);
    let width = PANEL.0 * cols as u32;
    let per_row = ((width as i32 - 32) / ENTRY_W).max(1) as usize;
    let rows = names.len().div_ceil(per_row) + usize::from(styles);
    let lines = caption(results, panels, width).len() as u32;
    (rows as u32 * ENTRY_H as u32 + 16, lines * (CAPTION + 6) + 14)
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panels: &[Panel],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (names, styles) = legend_entries(panels);
    let (w, _) = area.dim_in_pixel();
    let per_row = ((w as i32 - 32) / ENTRY_W).max(1) as usize;
    area.draw(&PathElement::new(vec![(16, 4), (w as i32 - 16, 4)], BLACK.mix(0.3)))?;
    for (i, name) in names.iter().enumerate() {
        let (x, y) = (16 + (i % per_row) as i32 * ENTRY_W, 12 + (i / per_row) as i32 * ENTRY_H + ENTRY_H / 2);
        let (c, marker) = style(name);
        area.draw(&PathElement::new(vec![(x, y), (x + 48, y)], c.stroke_width(3)))?;
        draw_marker(area, (x + 24, y), marker, c, 6)?;
        area.draw(&Text::new(name.clone(), (x + 58, y - LABEL as i32 / 2 - 1), ("sans-serif", LABEL)))?;
    }
    if styles {
        let y = 12 + names.len().div_ceil(per_row) as i32 * ENTRY_H + ENTRY_H / 2;
        let grey = BLACK.mix(0.7).stroke_width(3);
        area.draw(&PathElement::new(vec![(16, y), (64, y)], grey))?;
        area.draw(&Text::new(
            "interference, beside a mapping thread".to_string(),
            (74, y - LABEL as i32 / 2 - 1),
            ("sans-serif", LABEL),
        ))?;
        let x = 16 + ENTRY_W * 2 + 40;
        for k in 0..3 {
            area.draw(&PathElement::new(vec![(x + k * 18, y), (x + k * 18 + 11, y)], grey))?;
        }
        area.draw(&Text::new("alone".to_string(), (x + 58, y - LABEL as i32 / 2 - 1), ("sans-serif", LABEL)))?;
    }
    Ok(())
}

/// Writes the plot of `results` to `path` (`.svg` or `.png`).
pub fn plot<C>(path: &Path, results: &Results<C>) -> Result<(), String> {
    let ext = path.extension().map(|x| x.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if ext != "svg" && ext != "png" {
        return Err(format!("{}: the plot file must end in .svg or .png", path.display()));
    }
    let panels = panels(results);
    if panels.is_empty() {
        return Err("nothing to plot".to_string());
    }
    let font = find_font();
    let cols = if panels.len() > 3 { 2 } else { 1 };
    let (legend_h, caption_h) = legend_caption_heights(results, &panels, cols);
    let size = (PANEL.0 * cols as u32, PANEL.1 * panels.len().div_ceil(cols) as u32 + legend_h + caption_h);
    if ext == "png" {
        if font.is_none() {
            return Err(
                "no TrueType/OpenType font under /usr/share/fonts: a PNG needs one for its text; write FILE.svg instead"
                    .to_string(),
            );
        }
        draw(BitMapBackend::new(path, size).into_drawing_area(), results, &panels, true)
    } else {
        if font.is_none() {
            eprintln!("softmm: no font under /usr/share/fonts: {} is drawn without text", path.display());
        }
        draw(SVGBackend::new(path, size).into_drawing_area(), results, &panels, font.is_some())
    }
}

/// One panel of [`bars`]: a horizontal bar per row, its median, with a
/// line from its min to its max.
pub struct BarPanel {
    /// The panel's title.
    pub title: String,
    /// The x axis' label (what the bars measure).
    pub unit: String,
    /// The bars, top to bottom.
    pub rows: Vec<Bar>,
}

/// One bar of a [`BarPanel`].
pub struct Bar {
    /// Its label.
    pub label: String,
    /// Its colour's index in the palette: bars of one kind share one.
    pub group: usize,
    /// The median, and the range of the runs.
    pub median: f64,
    /// The slowest run's value.
    pub min: f64,
    /// The fastest run's value.
    pub max: f64,
}

/// Okabe & Ito's palette, less black (the host's).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(213, 94, 0),
    RGBColor(86, 180, 233),
    RGBColor(240, 228, 66),
];

/// Rows' height and the room for a panel's title and axis, in pixels.
const BAR_H: u32 = 34;
const BAR_PANEL_EXTRA: u32 = 130;
/// The label column's width.
const BAR_LABELS: u32 = 240;

/// Writes `panels` as bar charts, one column, with `caption` under them,
/// to `path` (`.svg` or `.png`): the replay bench's per-policy figure.
pub fn bars(path: &Path, panels: &[BarPanel], caption: &str) -> Result<(), String> {
    let ext = path.extension().map(|x| x.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if ext != "svg" && ext != "png" {
        return Err(format!("{}: the plot file must end in .svg or .png", path.display()));
    }
    if panels.iter().all(|p| p.rows.is_empty()) {
        return Err("nothing to plot".to_string());
    }
    let font = find_font();
    if ext == "png" && font.is_none() {
        return Err(
            "no TrueType/OpenType font under /usr/share/fonts: a PNG needs one for its text; write FILE.svg instead"
                .to_string(),
        );
    }
    let heights: Vec<u32> = panels.iter().map(|p| BAR_PANEL_EXTRA + BAR_H * p.rows.len() as u32).collect();
    let size = (PANEL.0 + BAR_LABELS, heights.iter().sum::<u32>() + 2 * CAPTION + 20);
    if ext == "png" {
        draw_bars(BitMapBackend::new(path, size).into_drawing_area(), panels, &heights, caption, true)
    } else {
        if font.is_none() {
            eprintln!("softmm: no font under /usr/share/fonts: {} is drawn without text", path.display());
        }
        draw_bars(SVGBackend::new(path, size).into_drawing_area(), panels, &heights, caption, font.is_some())
    }
}

fn draw_bars<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[BarPanel],
    heights: &[u32],
    caption: &str,
    text: bool,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (body, foot) = root.split_vertically(heights.iter().sum::<u32>());
    let mut rest = body;
    for (panel, &h) in panels.iter().zip(heights) {
        let (area, below) = rest.split_vertically(h);
        rest = below;
        bar_panel(&area, panel, text).map_err(|e| e.to_string())?;
    }
    if text {
        foot.draw(&Text::new(caption.to_string(), (16, 8), ("sans-serif", CAPTION))).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn bar_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &BarPanel,
    text: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let n = panel.rows.len();
    let top = panel.rows.iter().map(|r| r.max.max(r.median)).fold(0.0, f64::max).max(f64::MIN_POSITIVE) * 1.1;
    let mut chart = ChartBuilder::on(area);
    chart.margin(12).x_label_area_size(if text { 56 } else { 10 }).y_label_area_size(BAR_LABELS);
    if text {
        chart.caption(&panel.title, ("sans-serif", TITLE));
    }
    // Row k (from the top) spans y in [n - 1 - k, n - k).
    let mut chart = chart.build_cartesian_2d(0.0..top, 0.0..n as f64)?;
    let x_label = |v: &f64| si(*v);
    let mut mesh = chart.configure_mesh();
    mesh.disable_y_mesh().x_labels(6).y_labels(0);
    if text {
        mesh.x_desc(panel.unit.as_str())
            .label_style(("sans-serif", TICK))
            .axis_desc_style(("sans-serif", LABEL))
            .x_label_formatter(&x_label);
    } else {
        mesh.x_label_formatter(&|_| String::new());
    }
    mesh.draw()?;
    for (k, bar) in panel.rows.iter().enumerate() {
        let y = (n - 1 - k) as f64;
        let colour = PALETTE[bar.group % PALETTE.len()];
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y + 0.15), (bar.median, y + 0.85)],
            colour.mix(0.85).filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(bar.min, y + 0.5), (bar.max, y + 0.5)],
            BLACK.stroke_width(3),
        )))?;
        if text {
            // The label, right-aligned left of the axis, in the panel's
            // pixels (the chart clips to its plotting area).
            let (px, py) = chart.backend_coord(&(0.0, y + 0.5));
            let (ax, ay) = area.get_base_pixel();
            let style = TextStyle::from(("sans-serif", TICK).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
            area.draw(&Text::new(bar.label.clone(), (px - ax - 10, py - ay), style))?;
        }
    }
    Ok(())
}
