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

/// Draws `series` into an SVG file at `path`, and the same chart as PNG beside
/// it (same name, `.png`). The y axis is logarithmic: the protocols' times
/// span several orders of magnitude at large n (BD's are seconds where
/// TGDH's are tens of ms), and a linear axis flattens all but the slowest.
pub fn line_chart(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series]) -> Result<()> {
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let ys = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|y| *y > 0.0);
    let y_max = ys().fold(1.0, f64::max) * 1.5;
    let y_min = ys().fold(y_max, f64::min) / 1.5;
    let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max * 1.02, (y_min..y_max).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(format!("{y_label}, log scale"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| if *y >= 10.0 { format!("{y:.0}") } else { format!("{y}") })
        // No minor grid: it would double the SVG's size for little reading help.
        .max_light_lines(0)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    drop(chart);
    drop(root);
    svg_to_png(path, &path.with_extension("png"))
}
