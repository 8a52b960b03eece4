//! MAX's tensor print styles (docs/dump-format.md, "Styles"), following MAX's serializer so
//! that loupe's prints and `python -m loupe_reference dump` prints diff cleanly:
//! the tensor is a series of 2-D matrices (leading dims flattened), each `[` rows `]`, rows
//! `[a, b, c, ..., x, y, z]` joined by `",\n"`, one extra bracket pair per dimension beyond
//! 2, and a rank-1 tensor printed as one row (`[[...]]`).
//!
//! COMPACT: 4 fixed decimals; any run of 7 or more elements / rows / matrices shows its first
//! and last 3 around `...,`. FULL: every value in exponent form at a chosen precision.

/// Elision rule of COMPACT: runs of this length or more are abbreviated.
const ELIDE_AT: usize = 7;
const EDGE: usize = ELIDE_AT / 2;
const FILLER: &str = "..., ";

/// One tensor in COMPACT style.
pub fn compact(label: &str, shape: &[usize], data: &[f32]) -> String {
    format!("{label} = tensor({}, dtype=f32, shape={shape:?})", serialize(shape, data, &|v| format!("{v:.4}"), true))
}

/// One tensor in FULL style: every value, `digits` digits after the point in exponent form.
pub fn full(label: &str, shape: &[usize], data: &[f32], digits: usize) -> String {
    format!(
        "{label} = tensor({}, dtype=f32, shape={shape:?})",
        serialize(shape, data, &|v| format!("{v:.digits$e}"), false)
    )
}

fn row(out: &mut String, values: &[f32], fmt: &dyn Fn(f32) -> String, compact: bool) {
    let join = |vs: &[f32]| vs.iter().map(|&v| fmt(v)).collect::<Vec<_>>().join(", ");
    out.push('[');
    let n = values.len();
    if compact && n >= ELIDE_AT {
        out.push_str(&join(&values[..EDGE]));
        out.push_str(", ");
        out.push_str(FILLER);
        out.push_str(&join(&values[n - EDGE..]));
    } else {
        out.push_str(&join(values));
    }
    out.push(']');
}

fn serialize(shape: &[usize], data: &[f32], fmt: &dyn Fn(f32) -> String, compact: bool) -> String {
    let rank = shape.len().max(1);
    let cols = shape.last().copied().unwrap_or(data.len().min(1)).max(1);
    let rows = if shape.len() < 2 { 1 } else { shape[shape.len() - 2] };
    let mats = if shape.len() > 2 { shape[..shape.len() - 2].iter().product() } else { 1 };
    let mut out = "[".repeat(rank.saturating_sub(2));
    let mut mi = 0;
    while mi < mats {
        if mi > 0 {
            out.push_str(",\n");
        }
        out.push('[');
        let mut ri = 0;
        while ri < rows {
            if ri > 0 {
                out.push('\n');
            }
            let at = (mi * rows + ri) * cols;
            row(&mut out, data.get(at..at + cols).unwrap_or(&[]), fmt, compact);
            ri += 1;
            if ri != rows {
                out.push(',');
            }
            if compact && rows >= ELIDE_AT && ri == EDGE {
                out.push('\n');
                out.push_str(FILLER);
                ri = rows - EDGE;
            }
        }
        out.push(']');
        mi += 1;
        if compact && mats >= ELIDE_AT && mi == EDGE {
            out.push('\n');
            out.push_str(FILLER);
            mi = mats - EDGE;
        }
    }
    out.push_str(&"]".repeat(rank.saturating_sub(2)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_matches_max_example() {
        let data = vec![1.12345f32; 20];
        assert_eq!(
            compact("a", &[20], &data),
            "a = tensor([[1.1235, 1.1235, 1.1235, ..., 1.1235, 1.1235, 1.1235]], dtype=f32, shape=[20])"
        );
    }

    #[test]
    fn short_dims_are_not_elided_and_full_prints_everything() {
        assert_eq!(
            compact("b", &[2, 2], &[1.0, 2.0, 3.0, -4.5]),
            "b = tensor([[1.0000, 2.0000],\n[3.0000, -4.5000]], dtype=f32, shape=[2, 2])"
        );
        let f = full("c", &[8], &[0.5; 8], 2);
        assert_eq!(f.matches("5.00e-1").count(), 8);
    }
}
