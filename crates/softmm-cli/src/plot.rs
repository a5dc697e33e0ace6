//! Throughput against threads, one panel per workload and mode, one line per
//! policy plus the host (plotters). `interference` draws the interfered runs
//! solid and the runs alone dashed, in the same panel.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{rows, si, Sample};

const PANEL: (u32, u32) = (720, 460);

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

fn color(policy: &str) -> RGBColor {
    match policy {
        "host" => RGBColor(0, 0, 0),
        "mmap-lock" => RGBColor(214, 39, 40),
        "speculative" => RGBColor(255, 127, 14),
        "per-vma" => RGBColor(31, 119, 180),
        "per-vma-seq" => RGBColor(44, 160, 44),
        _ => RGBColor(148, 103, 189),
    }
}

/// One line: `(threads, median ops/s)` points of one policy.
struct Series {
    policy: String,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

struct Panel {
    title: String,
    series: Vec<Series>,
}

fn panels(samples: &[Sample]) -> Vec<Panel> {
    let mut panels: Vec<Panel> = Vec::new();
    for row in rows(samples) {
        let s = row.samples[0];
        let dashed = s.workload == "interference" && s.mode == "alone";
        let title = if s.workload == "interference" {
            "interference (solid: with an mmap thread, dashed: alone)".to_string()
        } else if s.workload == "pft" {
            "pft".to_string()
        } else {
            format!("{} ({})", s.workload, s.mode)
        };
        let panel = match panels.iter_mut().position(|p| p.title == title) {
            Some(i) => &mut panels[i],
            None => {
                panels.push(Panel { title, series: Vec::new() });
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
        series.points.push((s.threads as f64, row.median()));
    }
    panels
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, panels: &[Panel], text: bool) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
    root.fill(&WHITE).map_err(e)?;
    let cols = if panels.len() > 1 { 2 } else { 1 };
    let nrows = panels.len().div_ceil(cols);
    let areas = root.split_evenly((nrows, cols));
    for (panel, area) in panels.iter().zip(areas) {
        let xs: Vec<f64> = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let (xmin, xmax) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        let ymax = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max).max(1.0);
        let nx = (xmax - xmin) as usize + 1;
        let mut builder = ChartBuilder::on(&area);
        builder.margin(12);
        if text {
            builder.caption(&panel.title, ("sans-serif", 18)).x_label_area_size(40).y_label_area_size(64);
        }
        let mut chart = builder.build_cartesian_2d(xmin - 0.3..xmax + 0.3, 0.0..ymax * 1.12).map_err(e)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("threads")
                .y_desc("ops/s")
                .x_labels(nx.min(16))
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| si(*v));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(e)?;
        for s in &panel.series {
            let c = color(&s.policy);
            let style = ShapeStyle { color: c.to_rgba(), filled: false, stroke_width: 2 };
            let mut pts = s.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style)).map_err(e)?;
            } else {
                let name = s.policy.clone();
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(e)?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            }
            chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled()))).map_err(e)?;
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Writes the plot of `samples` to `path` (`.svg` or `.png`).
pub fn plot(path: &Path, samples: &[Sample]) -> Result<(), String> {
    let ext = path.extension().map(|x| x.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if ext != "svg" && ext != "png" {
        return Err(format!("{}: the plot file must end in .svg or .png", path.display()));
    }
    let panels = panels(samples);
    if panels.is_empty() {
        return Err("nothing to plot".to_string());
    }
    let font = find_font();
    let cols = if panels.len() > 1 { 2 } else { 1 };
    let size = (PANEL.0 * cols as u32, PANEL.1 * panels.len().div_ceil(cols) as u32);
    if ext == "png" {
        if font.is_none() {
            return Err(
                "no TrueType/OpenType font under /usr/share/fonts: a PNG needs one for its text; write FILE.svg instead"
                    .to_string(),
            );
        }
        draw(BitMapBackend::new(path, size).into_drawing_area(), &panels, true)
    } else {
        if font.is_none() {
            eprintln!("softmm: no font under /usr/share/fonts: {} is drawn without text", path.display());
        }
        draw(SVGBackend::new(path, size).into_drawing_area(), &panels, font.is_some())
    }
}
