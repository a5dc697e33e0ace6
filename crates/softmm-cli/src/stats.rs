//! Statistics of repeated samples: medians and ranges over the repeats,
//! and the figures they print as (`1.23M`, three significant digits, per
//! operation).
//!
//! A leaf: it imports nothing else of the lab.

/// `values` sorted, lowest first (NaN last).
pub fn sorted(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `values`: the middle one, or the mean of the middle two;
/// `None` if there are none.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v = sorted(values);
    let m = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[m]),
        _ => Some((v[m - 1] + v[m]) / 2.0),
    }
}

/// The lowest and highest of `values`; `None` if there are none.
pub fn range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let v = sorted(values);
    Some((*v.first()?, *v.last()?))
}

/// One design's figure in every repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The policy's name.
    pub policy: String,
    /// `(repeat, value)`.
    pub values: Vec<(usize, f64)>,
}

impl Figure {
    /// The median of the repeats.
    pub fn median(&self) -> Option<f64> {
        median(self.values.iter().map(|x| x.1))
    }

    /// `median (min-max)`, or `-`.
    pub fn cell(&self) -> String {
        let v = sorted(self.values.iter().map(|x| x.1));
        match (self.median(), v.first(), v.last()) {
            (Some(m), Some(lo), Some(hi)) if v.len() > 1 && fig(*lo) != fig(*hi) => {
                format!("{} ({}-{})", fig(m), fig(*lo), fig(*hi))
            }
            (Some(m), _, _) => fig(m),
            _ => "-".into(),
        }
    }
}

/// `1.23M`-style number.
pub fn si(x: f64) -> String {
    let (v, unit) = match x.abs() {
        a if a >= 1e9 => (x / 1e9, "G"),
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e3 => (x / 1e3, "k"),
        _ => (x, ""),
    };
    if v.abs() >= 100.0 {
        format!("{v:.0}{unit}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// `total` per operation with three significant digits; `-` where the
/// counter does not apply or nothing ran.
pub fn per_op(total: Option<u64>, ops: u64) -> String {
    match total {
        None => "-".to_string(),
        Some(_) if ops == 0 => "-".to_string(),
        Some(t) => {
            let v = t as f64 / ops as f64;
            if v == 0.0 {
                "0".to_string()
            } else if v >= 100.0 {
                format!("{v:.0}")
            } else if v >= 0.01 {
                format!("{v:.3}")
            } else {
                format!("{v:.1e}")
            }
        }
    }
}

/// A figure with three significant digits (`1.23M`, `0.00781`).
pub fn fig(v: f64) -> String {
    if v == 0.0 || v.abs() >= 1000.0 {
        return si(v);
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_keep_three_digits() {
        assert_eq!(fig(0.0078125), "0.00781");
        assert_eq!(fig(1.004), "1.00");
        assert_eq!(fig(36.3), "36.3");
        assert_eq!(fig(736_000.0), "736k");
    }

    #[test]
    fn medians_and_ranges_of_the_repeats() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median([]), None);
        assert_eq!(range([3.0, 1.0, 2.0]), Some((1.0, 3.0)));
        let f = Figure { policy: "p".into(), values: vec![(0, 10.0), (1, 30.0), (2, 20.0)] };
        assert_eq!((f.median(), f.cell()), (Some(20.0), "20.0 (10.0-30.0)".to_string()));
        assert_eq!(per_op(None, 1), "-");
        assert_eq!(per_op(Some(1), 0), "-");
        assert_eq!(per_op(Some(3), 2), "1.500");
    }
}
