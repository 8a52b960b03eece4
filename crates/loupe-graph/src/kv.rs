//! The key/value cache of one sequence: per attention layer, one row per position of
//! `n_kv_heads * head_dim` keys (after RoPE) and as many values, stored as f32 or f16
//! ([`KvDtype`]; f16 halves the bytes decode reads per cached position and rounds to
//! nearest even, as the batched engine's paged cache does).

use half::slice::HalfBitsSliceExt;
use loupe_tensor::ops::KvBlocks;

use crate::{GraphError, KvDtype};

/// How an attention node writes its keys into the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvWrite {
    /// Row `p` holds the key of position `p`.
    #[default]
    InPlace,
    /// Row `p` holds the key of position `p - 1`, row 0 zeros: an off-by-one in the cache
    /// write (a planted fault, [`crate::FaultClass::KvWrite`]). Values are written in place.
    OneLate,
    /// [`KvWrite::InPlace`] for the first call (the prompt), [`KvWrite::OneLate`] for every
    /// later one (decode): a cache bug one forward pass over the whole sequence cannot show,
    /// only incremental decode (fault [`crate::FaultClass::KvWriteDecode`]).
    OneLateAtDecode,
}

/// One layer's keys or values, grown as positions are appended.
#[derive(Debug, Clone)]
enum Rows {
    F32(Vec<f32>),
    /// f16 bit patterns (`half`'s slice casts view them as `f16`).
    F16(Vec<u16>),
    /// E4M3 codes and one guarded scale per `group` elements ([`KvDtype::fp8_group`] of the
    /// row width; appends are whole rows).
    Fp8 {
        codes: Vec<u8>,
        scales: Vec<f32>,
        group: usize,
    },
}

impl Rows {
    fn new(dtype: KvDtype, width: usize) -> Rows {
        match dtype {
            KvDtype::F32 => Rows::F32(Vec::new()),
            KvDtype::F16 => Rows::F16(Vec::new()),
            KvDtype::Fp8E4M3 => Rows::Fp8 { codes: Vec::new(), scales: Vec::new(), group: KvDtype::fp8_group(width) },
        }
    }

    fn len(&self) -> usize {
        match self {
            Rows::F32(d) => d.len(),
            Rows::F16(d) => d.len(),
            Rows::Fp8 { codes, .. } => codes.len(),
        }
    }

    fn reserve_total(&mut self, n: usize) {
        match self {
            Rows::F32(d) => d.reserve(n.saturating_sub(d.len())),
            Rows::F16(d) => d.reserve(n.saturating_sub(d.len())),
            Rows::Fp8 { codes, scales, group } => {
                codes.reserve(n.saturating_sub(codes.len()));
                scales.reserve((n / *group).saturating_sub(scales.len()));
            }
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Rows::F32(d) => d.truncate(n),
            Rows::F16(d) => d.truncate(n),
            Rows::Fp8 { codes, scales, group } => {
                codes.truncate(n);
                scales.truncate(n / *group);
            }
        }
    }

    /// Appends `rows`, rounded to nearest even when stored as f16, quantized per row when
    /// stored as FP8.
    fn extend(&mut self, rows: &[f32]) {
        match self {
            Rows::F32(d) => d.extend_from_slice(rows),
            Rows::F16(d) => loupe_tensor::f16_rows::narrow_extend(rows, d),
            Rows::Fp8 { codes, scales, group } => {
                let (start, s) = (codes.len(), scales.len());
                codes.resize(start + rows.len(), 0);
                scales.resize(s + rows.len() / *group, 0.0);
                // Whole rows by construction (the cache appends rows of `width`).
                let _ = loupe_tensor::fp8::quantize_rows_e4m3(rows, *group, &mut codes[start..], &mut scales[s..]);
            }
        }
    }

    /// Appends `n` zeros.
    fn extend_zeros(&mut self, n: usize) {
        match self {
            Rows::F32(d) => d.resize(d.len() + n, 0.0),
            Rows::F16(d) => d.resize(d.len() + n, 0),
            Rows::Fp8 { codes, scales, group } => {
                codes.resize(codes.len() + n, 0);
                scales.resize(scales.len() + n / *group, 0.0);
            }
        }
    }

    fn view(&self, n: usize) -> KvBlocks<'_> {
        match self {
            Rows::F32(d) => KvBlocks::F32(&d[..n]),
            Rows::F16(d) => KvBlocks::F16(d[..n].reinterpret_cast()),
            Rows::Fp8 { codes, scales, group } => {
                KvBlocks::Fp8 { codes: &codes[..n], scales: &scales[..n / *group], group: *group }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct KvCache {
    dtype: KvDtype,
    keys: Vec<Rows>,
    values: Vec<Rows>,
    /// Per layer, the true keys of every position, kept only for layers written
    /// [`KvWrite::OneLate`] (empty, unallocated, for every other layer): the key of the last
    /// position of one call is needed in the next call's first row.
    true_keys: Vec<Vec<f32>>,
    width: usize,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An f32 cache for `layers` layers of rows `width` wide, holding up to `capacity`
    /// positions. Memory grows with use up to the capacity.
    pub fn new(layers: usize, width: usize, capacity: usize) -> KvCache {
        KvCache::with_dtype(layers, width, capacity, KvDtype::F32)
    }

    /// [`KvCache::new`] storing rows as `dtype`.
    pub fn with_dtype(layers: usize, width: usize, capacity: usize, dtype: KvDtype) -> KvCache {
        KvCache {
            dtype,
            keys: vec![Rows::new(dtype, width); layers],
            values: vec![Rows::new(dtype, width); layers],
            true_keys: vec![Vec::new(); layers],
            width,
            len: 0,
            capacity,
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes of the rows held (keys and values of every layer).
    pub fn bytes(&self) -> usize {
        2 * self.keys.len() * self.len * self.dtype.row_bytes(self.width)
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reserves room for `positions` positions in every layer up front (so decode does not
    /// reallocate).
    pub fn reserve(&mut self, positions: usize) {
        let n = positions.min(self.capacity) * self.width;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.reserve_total(n);
        }
    }

    /// Forgets positions from `len` on (to rewind or restart a sequence).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.truncate(self.len * self.width);
        }
        for buf in self.true_keys.iter_mut() {
            buf.truncate(self.len * self.width);
        }
    }

    /// Checks that `tokens` more positions fit.
    pub fn check_room(&self, tokens: usize) -> Result<(), GraphError> {
        let needed = self.len + tokens;
        if needed > self.capacity {
            return Err(GraphError::ContextOverflow { needed, capacity: self.capacity });
        }
        Ok(())
    }

    /// Appends this call's keys and values for `layer` (rows `len..len+tokens`) and
    /// returns the whole cached keys and values of that layer.
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> (KvBlocks<'_>, KvBlocks<'_>) {
        let start = self.len * self.width;
        let keys = &mut self.keys[layer];
        keys.truncate(start);
        keys.extend(k);
        let values = &mut self.values[layer];
        values.truncate(start);
        values.extend(v);
        let n = start + k.len();
        (self.keys[layer].view(n), self.values[layer].view(start + v.len()))
    }

    /// [`KvCache::append`] with keys one position late ([`KvWrite::OneLate`]).
    pub(crate) fn append_late(&mut self, layer: usize, k: &[f32], v: &[f32]) -> (KvBlocks<'_>, KvBlocks<'_>) {
        let w = self.width;
        let start = self.len * w;
        let truth = &mut self.true_keys[layer];
        truth.truncate(start);
        truth.extend_from_slice(k);
        let keys = &mut self.keys[layer];
        keys.truncate(start);
        let rows = k.len() / w.max(1);
        for p in self.len..self.len + rows {
            match p.checked_sub(1) {
                Some(prev) => keys.extend(&truth[prev * w..(prev + 1) * w]),
                None => keys.extend_zeros(w),
            }
        }
        let values = &mut self.values[layer];
        values.truncate(start);
        values.extend(v);
        let (nk, nv) = (self.keys[layer].len(), self.values[layer].len());
        (self.keys[layer].view(nk), self.values[layer].view(nv))
    }

    /// [`KvWrite::OneLateAtDecode`]: in place while the cache is empty (the true keys kept
    /// for the later calls), one position late after that.
    pub(crate) fn append_late_at_decode(&mut self, layer: usize, k: &[f32], v: &[f32]) -> (KvBlocks<'_>, KvBlocks<'_>) {
        if self.len > 0 {
            return self.append_late(layer, k, v);
        }
        let truth = &mut self.true_keys[layer];
        truth.clear();
        truth.extend_from_slice(k);
        self.append(layer, k, v)
    }

    /// Marks `tokens` positions as written by every layer.
    pub(crate) fn commit(&mut self, tokens: usize) {
        self.len += tokens;
    }

    /// The cached keys and values of one layer (for taps and tests).
    pub fn layer(&self, layer: usize) -> (KvBlocks<'_>, KvBlocks<'_>) {
        let n = self.len * self.width;
        (self.keys[layer].view(n), self.values[layer].view(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn late_write_shifts_keys_across_calls() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut kv = KvCache::with_dtype(1, 1, 8, dtype);
            let (k, v) = kv.append_late(0, &[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]);
            assert_eq!(widened(k), [0.0, 1.0, 2.0]);
            assert_eq!(widened(v), [10.0, 20.0, 30.0]);
            kv.commit(3);
            // the next call's first row holds the previous call's last key
            let (k, _) = kv.append_late(0, &[4.0], &[40.0]);
            assert_eq!(widened(k), [0.0, 1.0, 2.0, 3.0]);
            kv.commit(1);
            kv.truncate(2);
            let (k, _) = kv.append_late(0, &[5.0], &[50.0]);
            assert_eq!(widened(k), [0.0, 1.0, 2.0]);
        }
    }

    #[test]
    fn late_write_at_decode_spares_the_first_call() {
        let mut kv = KvCache::new(1, 1, 8);
        let (k, _) = kv.append_late_at_decode(0, &[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]);
        assert_eq!(widened(k), [1.0, 2.0, 3.0], "the prompt is written in place");
        kv.commit(3);
        let (k, v) = kv.append_late_at_decode(0, &[4.0], &[40.0]);
        assert_eq!(widened(k), [1.0, 2.0, 3.0, 3.0], "a decode row holds the previous position's key");
        assert_eq!(widened(v), [10.0, 20.0, 30.0, 40.0]);
        kv.commit(1);
        let (k, _) = kv.append_late_at_decode(0, &[5.0], &[50.0]);
        assert_eq!(widened(k), [1.0, 2.0, 3.0, 3.0, 4.0]);
    }

    fn widened(rows: KvBlocks<'_>) -> Vec<f32> {
        rows.to_f32_vec()
    }

    #[test]
    fn f16_rows_round_to_nearest_even_and_take_half_the_bytes() {
        let mut f32_cache = KvCache::with_dtype(2, 3, 4, KvDtype::F32);
        let mut f16_cache = KvCache::with_dtype(2, 3, 4, KvDtype::F16);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even rounds down; 65520 overflows f16.
        let row = [1.0 + 2f32.powi(-11), -0.1, 65520.0];
        for cache in [&mut f32_cache, &mut f16_cache] {
            for layer in 0..2 {
                cache.append(layer, &row, &row);
            }
            cache.commit(1);
        }
        let (k, v) = f16_cache.layer(1);
        let want: Vec<f32> = row.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(widened(k), want);
        assert_eq!(widened(v), want);
        assert_eq!(want[0], 1.0);
        assert!(want[2].is_infinite());
        assert_eq!(widened(f32_cache.layer(1).0), row);
        assert_eq!(f32_cache.bytes(), 2 * f16_cache.bytes());
        assert_eq!(f16_cache.bytes(), 2 * 2 * 3 * 2);
        f16_cache.truncate(0);
        assert_eq!(f16_cache.bytes(), 0);
        assert!(widened(f16_cache.layer(0).0).is_empty());
    }

    #[test]
    fn fp8_rows_keep_a_guarded_scale_per_row_and_truncate_with_them() {
        let mut cache = KvCache::with_dtype(1, 4, 8, KvDtype::Fp8E4M3);
        let rows = [1.0f32, -2.0, 0.5, 448.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.1, -0.2, 7.5];
        cache.append(0, &rows, &rows);
        cache.commit(3);
        let (k, v) = cache.layer(0);
        let (mut codes, mut scales) = ([0u8; 12], [0f32; 3]);
        loupe_tensor::fp8::quantize_rows_e4m3(&rows, 4, &mut codes, &mut scales).unwrap();
        let want = KvBlocks::Fp8 { codes: &codes, scales: &scales, group: 4 }.to_f32_vec();
        assert_eq!(widened(k), want);
        assert_eq!(widened(v), want);
        assert_eq!(&widened(k)[4..8], &[0.0; 4], "an all-zero row stays exact zeros (guarded scale)");
        assert_eq!(widened(k)[3], 448.0, "the row's max maps to E4M3's max exactly");
        assert_eq!(cache.bytes(), 2 * 3 * (4 + 4), "a byte per element and 4 per row's scale");
        cache.truncate(1);
        let (k, _) = cache.append(0, &rows[8..], &rows[8..]);
        assert_eq!(widened(k), [&want[..4], &want[8..]].concat(), "rows and scales truncate together");
    }
}
