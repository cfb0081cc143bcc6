//! SVG charts for the benchmarks (via-pingpong, mttl-bench): a quantity
//! against message size, one line per transport, in the manner of the
//! latency and bandwidth figures of the VIA and MTTL papers.

use std::fmt::Write as _;

const W: f64 = 720.0;
const H: f64 = 440.0;
const L: f64 = 70.0;
const R: f64 = 150.0;
const T: f64 = 30.0;
const B: f64 = 50.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"];

fn log2(x: f64) -> f64 {
    x.max(1.0).log2()
}

/// One measurement: which line it belongs to, at which size, what value.
#[derive(Clone, Copy, Debug)]
pub struct Point<'a> {
    pub series: &'a str,
    pub bytes: usize,
    pub value: f64,
}

/// An SVG chart of `points` against message size (log x; log y when
/// `ylog`), one line per series, coloured in the order of `series` (pass
/// the same order to several charts and their colours agree).
pub fn chart(points: &[Point], series: &[&str], ylabel: &str, ylog: bool) -> String {
    let pts: Vec<&Point> = points.iter().filter(|p| p.bytes > 0).collect();
    let xmax = pts.iter().map(|r| log2(r.bytes as f64)).fold(1.0, f64::max).ceil();
    let (ymin, ymax) = if ylog {
        let lo = pts.iter().map(|r| r.value).filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        let hi = pts.iter().map(|r| r.value).fold(1.0, f64::max);
        (lo.max(0.01).log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0))
    } else {
        let hi = pts.iter().map(|r| r.value).fold(1.0, f64::max);
        let step = 10f64.powf(hi.log10().floor()) / 2.0;
        (0.0, (hi / step).ceil() * step)
    };
    let px = |b: f64| L + log2(b) / xmax * (W - L - R);
    let py = |v: f64| {
        let f = if ylog { (v.max(1e-9).log10() - ymin) / (ymax - ymin) } else { (v - ymin) / (ymax - ymin) };
        H - B - f * (H - T - B)
    };
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(s, r#"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="black"/>"#, W - L - R, H - T - B);
    // x ticks: every other power of two
    let mut k = 0.0;
    while k <= xmax {
        let x = px(2f64.powf(k));
        let label = match k as u32 {
            k if k >= 20 => format!("{}M", 1u64 << (k - 20)),
            k if k >= 10 => format!("{}K", 1u64 << (k - 10)),
            k => format!("{}", 1u64 << k),
        };
        let _ = write!(s, r#"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="black"/><text x="{x}" y="{}" text-anchor="middle">{label}</text>"#, H - B, H - B + 5.0, H - B + 18.0);
        k += 2.0;
    }
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">message size [bytes]</text>"#, (L + W - R) / 2.0, H - 10.0);
    // y ticks
    if ylog {
        let mut e = ymin;
        while e <= ymax {
            let v = 10f64.powf(e);
            let yy = py(v);
            let _ = write!(s, r##"<line x1="{L}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{v}</text>"##, W - R, L - 5.0, yy + 4.0);
            e += 1.0;
        }
    } else {
        for i in 0..=5 {
            let v = ymin + (ymax - ymin) * i as f64 / 5.0;
            let yy = py(v);
            let _ = write!(s, r##"<line x1="{L}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{:.0}</text>"##, W - R, L - 5.0, yy + 4.0, v);
        }
    }
    let _ = write!(s, r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{ylabel}</text>"#, (T + H - B) / 2.0);
    for (i, t) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let line: Vec<String> = pts.iter().filter(|r| r.series == *t).map(|r| format!("{:.1},{:.1}", px(r.bytes as f64), py(r.value))).collect();
        if line.is_empty() {
            continue;
        }
        let _ = write!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, line.join(" "));
        let ly = T + 20.0 + 20.0 * i as f64;
        let _ = write!(s, r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{t}</text>"#, W - R + 10.0, W - R + 35.0, W - R + 40.0, ly + 4.0);
    }
    s.push_str("</svg>\n");
    s
}
