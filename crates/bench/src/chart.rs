//! Line charts for the benchmarks (SVG, via plotters), in the manner of the
//! TISSEC paper's figures: one line per protocol, group size on x, time on y.
//! Every SVG gets a PNG twin, rendered from the same SVG with resvg so the two
//! never disagree.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Series colours in order; the seventh (grey) is for five protocols, MLS and
/// the membership line of `bench events --engine daemon` on one chart.
const COLORS: [RGBColor; 7] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

/// Sans-serif families tried in order for the PNG's text; plotters writes
/// `font-family="sans-serif"`, which fontdb would otherwise map to Arial.
const SANS: [&str; 4] = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"];

/// The system fonts, loaded once per process (scanning them takes tens of ms).
fn fonts() -> Result<std::sync::Arc<resvg::usvg::fontdb::Database>> {
    static FONTS: OnceLock<std::sync::Arc<resvg::usvg::fontdb::Database>> = OnceLock::new();
    if let Some(db) = FONTS.get() {
        return Ok(db.clone());
    }
    let mut db = resvg::usvg::fontdb::Database::new();
    db.load_system_fonts();
    let families: Vec<String> = db.faces().flat_map(|f| f.families.iter().map(|(name, _)| name.clone())).collect();
    let Some(sans) = SANS.iter().map(|s| s.to_string()).find(|s| families.contains(s)).or(families.first().cloned())
    else {
        bail!(
            "no font found for the PNG charts' text (looked in the system font directories); \
             install one, e.g. `apt-get install fonts-dejavu-core`"
        );
    };
    db.set_sans_serif_family(sans);
    Ok(FONTS.get_or_init(|| std::sync::Arc::new(db)).clone())
}

/// Renders the SVG file at `svg` into a PNG file at `png`, at its own size.
pub fn svg_to_png(svg: &Path, png: &Path) -> Result<()> {
    let text = std::fs::read_to_string(svg).with_context(|| format!("reading {}", svg.display()))?;
    let options = resvg::usvg::Options { fontdb: fonts()?, ..Default::default() };
    let tree = resvg::usvg::Tree::from_str(&text, &options).with_context(|| format!("parsing {}", svg.display()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .with_context(|| format!("{}: empty image", svg.display()))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.save_png(png).with_context(|| format!("writing {}", png.display()))?;
    Ok(())
}

/// Chart size in pixels (the PNG is rendered at the SVG's size).
pub const SIZE: (u32, u32) = (1200, 800);

/// Draws `series` into an SVG file at `path`, and the same chart as PNG beside
/// it (same name, `.png`), 1200×800. The axes are linear as in the TISSEC
/// paper's figures; with `log_y` the time axis is logarithmic (for sweeps
/// where the slowest protocol flattens the others). Every series has its own
/// colour and marker shape, in the legend too.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
) -> Result<()> {
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let ys = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|y| *y > 0.0);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let builder = |root| {
        let mut b = ChartBuilder::on(root);
        b.caption(title, ("sans-serif", 28)).margin(20).x_label_area_size(60).y_label_area_size(90);
        b
    };
    // The same drawing for either y axis (plotters gives them different types).
    macro_rules! draw {
        ($chart:expr, $y_desc:expr) => {{
            let mut chart = $chart.map_err(|e| anyhow!("{e}"))?;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc($y_desc)
                .x_labels(13)
                .y_labels(12)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| tick(*y))
                // No minor grid: it would double the SVG's size for little reading help.
                .max_light_lines(0)
                .label_style(("sans-serif", 18))
                .axis_desc_style(("sans-serif", 20))
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
            for (i, s) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let pts = s.points.iter().copied();
                // Marker shapes in turn (circle, triangle, square, cross,
                // diamond), filled for the first five series, hollow after.
                let style = if i % 10 < 5 { color.filled() } else { color.stroke_width(2) };
                macro_rules! with_marker {
                    ($mk:expr) => {{
                        let mk = $mk;
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                            .map_err(|e| anyhow!("{e}"))?
                            .label(s.name.clone())
                            .legend(move |(x, y)| {
                                EmptyElement::at((x, y))
                                    + PathElement::new(vec![(0, 0), (24, 0)], color.stroke_width(2))
                                    + mk((12, 0))
                            });
                        chart
                            .draw_series(pts.map(move |p| EmptyElement::at(p) + mk((0, 0))))
                            .map_err(|e| anyhow!("{e}"))?;
                    }};
                }
                match i % 5 {
                    0 => with_marker!(move |c: (i32, i32)| Circle::new(c, 5, style)),
                    1 => with_marker!(move |c: (i32, i32)| TriangleMarker::new(c, 7, style)),
                    2 => {
                        with_marker!(move |(x, y): (i32, i32)| Rectangle::new([(x - 5, y - 5), (x + 5, y + 5)], style))
                    }
                    3 => with_marker!(move |c: (i32, i32)| Cross::new(c, 6, color.stroke_width(3))),
                    _ => with_marker!(move |(x, y): (i32, i32)| Polygon::new(
                        vec![(x, y - 7), (x + 7, y), (x, y + 7), (x - 7, y)],
                        style
                    )),
                }
            }
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .label_font(("sans-serif", 18))
                .background_style(WHITE.mix(0.85))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
        }};
    }
    if log_y {
        let y_max = ys().fold(1.0, f64::max) * 1.5;
        let y_min = ys().fold(y_max, f64::min) / 1.5;
        draw!(
            builder(&root).build_cartesian_2d(0.0..x_max * 1.02, (y_min..y_max).log_scale()),
            format!("{y_label}, log scale")
        );
    } else {
        let y_max = ys().fold(0.0, f64::max) * 1.08;
        draw!(builder(&root).build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max.max(1e-3)), y_label.to_string());
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    drop(root);
    svg_to_png(path, &path.with_extension("png"))
}

/// A tick label: whole numbers from 10 up, otherwise up to 3 significant digits.
fn tick(y: f64) -> String {
    if y.abs() >= 10.0 {
        format!("{y:.0}")
    } else if y == 0.0 {
        "0".into()
    } else {
        let digits = (2 - y.abs().log10().floor() as i32).max(0) as usize;
        format!("{y:.digits$}")
    }
}
