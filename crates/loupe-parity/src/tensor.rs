//! A loaded tensor (f32, row-major) and the layout transforms a mapping file can apply:
//! slicing a fused projection, permuting axes, reshaping heads, scaling.

use crate::error::ParityError;

/// An f32 tensor in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// One layout transform (mapping-file `transforms` entries, and split parts).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Elements `start..end` along `axis` (negative counts from the end).
    Slice { axis: isize, start: usize, end: usize },
    /// Axis permutation: output axis i is input axis `perm[i]` (numpy `transpose`).
    Transpose(Vec<usize>),
    /// New shape; one entry may be -1 (inferred).
    Reshape(Vec<i64>),
    /// `[.., H, D]` -> `[.., H*D]`.
    MergeHeads,
    /// `[.., H*D]` -> `[.., H, D]` with `heads` = H.
    SplitHeads { heads: usize },
    /// `[H, T, D]` -> `[T, H*D]` (attention kernels that keep heads first).
    HeadsFirst,
    /// Multiply every element (undo a residual or embedding multiplier).
    Scale(f64),
    /// Drop every dimension of size 1.
    Squeeze,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor { shape, data }
    }

    /// Number of rows when read as `[rows, cols]`: the first dimension for rank >= 2.
    pub fn rows(&self) -> usize {
        if self.shape.len() >= 2 {
            self.shape[0]
        } else {
            1
        }
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        if self.shape.len() >= 2 {
            self.shape[1..].iter().product()
        } else {
            self.data.len()
        }
    }

    /// Drops leading dimensions of size 1 (the batch dimension PyTorch dumps keep), keeping
    /// at least one dimension.
    pub fn squeeze_leading(&mut self) {
        while self.shape.len() > 1 && self.shape[0] == 1 {
            self.shape.remove(0);
        }
    }

    /// Applies `op`; `name` labels errors.
    pub fn apply(self, op: &Op, name: &str) -> Result<Tensor, ParityError> {
        let err = |reason: String| ParityError::Transform { name: name.to_string(), reason };
        let rank = self.shape.len();
        match op {
            Op::Slice { axis, start, end } => {
                let ax = resolve_axis(*axis, rank)
                    .ok_or_else(|| err(format!("axis {axis} out of range for shape {:?}", self.shape)))?;
                let len = self.shape[ax];
                if start > end || *end > len {
                    return Err(err(format!(
                        "slice {start}..{end} of axis {ax} (length {len}), shape {:?}",
                        self.shape
                    )));
                }
                let inner: usize = self.shape[ax + 1..].iter().product();
                let outer: usize = self.shape[..ax].iter().product();
                let mut data = Vec::with_capacity(outer * (end - start) * inner);
                for o in 0..outer {
                    let base = o * len * inner;
                    data.extend_from_slice(&self.data[base + start * inner..base + end * inner]);
                }
                let mut shape = self.shape;
                shape[ax] = end - start;
                Ok(Tensor { shape, data })
            }
            Op::Transpose(perm) => {
                let mut seen = vec![false; rank];
                if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
                    return Err(err(format!("transpose {perm:?} is not a permutation of {rank} axes")));
                }
                Ok(permute(&self, perm))
            }
            Op::Reshape(dims) => {
                let shape = infer_shape(dims, self.data.len()).ok_or_else(|| {
                    err(format!("cannot reshape {:?} ({} elements) to {dims:?}", self.shape, self.data.len()))
                })?;
                Ok(Tensor { shape, data: self.data })
            }
            Op::MergeHeads => {
                if rank < 2 {
                    return Err(err(format!("merge_heads needs rank >= 2, shape {:?}", self.shape)));
                }
                let mut shape = self.shape;
                let d = shape.pop().unwrap_or(1);
                if let Some(h) = shape.last_mut() {
                    *h *= d;
                }
                Ok(Tensor { shape, data: self.data })
            }
            Op::SplitHeads { heads } => {
                let last = self.shape.last().copied().unwrap_or(0);
                if *heads == 0 || last % heads != 0 {
                    return Err(err(format!("split_heads({heads}) of last axis {last}")));
                }
                let mut shape = self.shape;
                if let Some(l) = shape.last_mut() {
                    *l = *heads;
                }
                shape.push(last / heads);
                Ok(Tensor { shape, data: self.data })
            }
            Op::HeadsFirst => {
                if rank != 3 {
                    return Err(err(format!("heads_first needs [H, T, D], shape {:?}", self.shape)));
                }
                permute(&self, &[1, 0, 2]).apply(&Op::MergeHeads, name)
            }
            Op::Scale(f) => {
                let f = *f;
                Ok(Tensor {
                    shape: self.shape,
                    data: self.data.into_iter().map(|v| (f64::from(v) * f) as f32).collect(),
                })
            }
            Op::Squeeze => {
                let mut shape: Vec<usize> = self.shape.into_iter().filter(|&d| d != 1).collect();
                if shape.is_empty() {
                    shape.push(1);
                }
                Ok(Tensor { shape, data: self.data })
            }
        }
    }
}

fn resolve_axis(axis: isize, rank: usize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

fn infer_shape(dims: &[i64], n: usize) -> Option<Vec<usize>> {
    let unknown = dims.iter().filter(|&&d| d == -1).count();
    if unknown > 1 || dims.iter().any(|&d| d < -1) {
        return None;
    }
    let known: usize = dims.iter().filter(|&&d| d >= 0).try_fold(1usize, |a, &d| a.checked_mul(d as usize))?;
    let fill = if unknown == 1 {
        if known == 0 || !n.is_multiple_of(known) {
            return None;
        }
        n / known
    } else {
        1
    };
    let shape: Vec<usize> = dims.iter().map(|&d| if d == -1 { fill } else { d as usize }).collect();
    (shape.iter().product::<usize>() == n).then_some(shape)
}

/// General axis permutation (an odometer over the output indices).
fn permute(t: &Tensor, perm: &[usize]) -> Tensor {
    let rank = t.shape.len();
    let mut in_strides = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * t.shape[i + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let n = t.data.len();
    let mut data = Vec::with_capacity(n);
    if n > 0 {
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
            data.push(t.data[off]);
            for k in (0..rank).rev() {
                idx[k] += 1;
                if idx[k] < out_shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
    Tensor { shape: out_shape, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize]) -> Tensor {
        let n = shape.iter().product::<usize>();
        Tensor::new(shape.to_vec(), (0..n).map(|i| i as f32).collect())
    }

    #[test]
    fn slices_transposes_and_reshapes() {
        let x = t(&[2, 3]);
        let s = x.clone().apply(&Op::Slice { axis: -1, start: 1, end: 3 }, "x").expect("slice");
        assert_eq!((s.shape, s.data), (vec![2, 2], vec![1., 2., 4., 5.]));
        let tr = x.clone().apply(&Op::Transpose(vec![1, 0]), "x").expect("t");
        assert_eq!((tr.shape, tr.data), (vec![3, 2], vec![0., 3., 1., 4., 2., 5.]));
        assert!(x.clone().apply(&Op::Transpose(vec![0, 0]), "x").is_err());
        assert!(x.clone().apply(&Op::Slice { axis: 2, start: 0, end: 1 }, "x").is_err());
        let r = x.clone().apply(&Op::Reshape(vec![-1]), "x").expect("r");
        assert_eq!(r.shape, [6]);
        assert!(x.apply(&Op::Reshape(vec![4, -1]), "x").is_err());
    }

    #[test]
    fn head_layouts() {
        // [H=2, T=3, D=2] heads-first -> [T, H*D]: row t holds head 0 then head 1.
        let x = t(&[2, 3, 2]);
        let y = x.apply(&Op::HeadsFirst, "x").expect("heads_first");
        assert_eq!(y.shape, [3, 4]);
        assert_eq!(&y.data[..4], &[0., 1., 6., 7.]);
        let s = y.clone().apply(&Op::SplitHeads { heads: 2 }, "y").expect("split");
        assert_eq!(s.shape, [3, 2, 2]);
        assert_eq!(s.apply(&Op::MergeHeads, "s").expect("merge"), y);
        let mut b = t(&[1, 1, 4]);
        b.squeeze_leading();
        assert_eq!(b.shape, [4]);
    }
}
