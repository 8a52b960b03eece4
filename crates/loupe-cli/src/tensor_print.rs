//! MAX's tensor print styles (max-debugging.md, section 2).
//!
//! COMPACT: `label = tensor([[1.1235, ..., 1.1235]], dtype=f32, shape=[2, 20])`, 4 fixed
//! decimals, any dimension of 7 or more shown as its first 3 and last 3 entries around
//! `...`. FULL: every value in exponent form at a chosen precision.

use std::fmt::Write;

/// Elision rule of COMPACT: dimensions of this size or more are abbreviated.
const ELIDE_AT: usize = 7;
const EDGE: usize = 3;

/// One tensor in COMPACT style.
pub fn compact(label: &str, shape: &[usize], data: &[f32]) -> String {
    let mut s = format!("{label} = tensor(");
    nest(&mut s, shape, data, &|s, v| {
        let _ = write!(s, "{v:.4}");
    }, true);
    let _ = write!(s, ", dtype=f32, shape={shape:?})");
    s
}

/// One tensor in FULL style: every value, `digits` digits after the point in exponent form.
pub fn full(label: &str, shape: &[usize], data: &[f32], digits: usize) -> String {
    let mut s = format!("{label} = tensor(");
    nest(&mut s, shape, data, &|s, v| {
        let _ = write!(s, "{v:.digits$e}");
    }, false);
    let _ = write!(s, ", dtype=f32, shape={shape:?})");
    s
}

fn nest(s: &mut String, shape: &[usize], data: &[f32], fmt: &dyn Fn(&mut String, f32), elide: bool) {
    let Some((&n, rest)) = shape.split_first() else {
        if let Some(&v) = data.first() {
            fmt(s, v);
        }
        return;
    };
    let stride: usize = rest.iter().product();
    s.push('[');
    let indices: Vec<Option<usize>> = if elide && n >= ELIDE_AT {
        (0..EDGE).map(Some).chain(std::iter::once(None)).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, i) in indices.iter().enumerate() {
        if k > 0 {
            s.push_str(", ");
        }
        match i {
            Some(i) => nest(s, rest, &data[i * stride..(i + 1) * stride], fmt, elide),
            None => s.push_str("..."),
        }
    }
    s.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_matches_max_example() {
        let data = vec![1.12345f32; 20];
        assert_eq!(
            compact("a", &[1, 20], &data),
            "a = tensor([[1.1235, 1.1235, 1.1235, ..., 1.1235, 1.1235, 1.1235]], dtype=f32, shape=[1, 20])"
        );
    }

    #[test]
    fn short_dims_are_not_elided_and_full_prints_everything() {
        assert_eq!(compact("b", &[2, 2], &[1.0, 2.0, 3.0, -4.5]), "b = tensor([[1.0000, 2.0000], [3.0000, -4.5000]], dtype=f32, shape=[2, 2])");
        let f = full("c", &[8], &[0.5; 8], 2);
        assert_eq!(f.matches("5.00e-1").count(), 8);
    }
}
